//! Comparing two compiled contracts as the wire sees them. A field is its number, name, type and
//! label; a message-typed field is compared by the layout of its message (so our
//! `google.protobuf.Timestamp` matches upstream's meta/v1 `Time`, whose fields are the same), and
//! a `bytes` field of ours matches a Kubernetes object upstream embeds as a message (both are
//! length-delimited; the bytes are that object's encoding).
//!
//! Three questions, each answered with every finding at once:
//! - [`disagreements`]: what both contracts define, defined differently;
//! - [`missing`]: what a release defines that ours does not;
//! - [`private`]: what ours defines that no reference release defines the same way.

use std::collections::BTreeSet;

use protox::prost_reflect::{
    Cardinality, EnumDescriptor, FieldDescriptor, Kind, MessageDescriptor, ServiceDescriptor,
};

use super::load::Contract;

/// The externalgrpc package; only what it declares is compared (the rest is reached by type).
pub const PACKAGE: &str = "clusterautoscaler.cloudprovider.v1.externalgrpc";

/// Where a finding is, and what it is.
pub type Finding = String;

/// What `ours` and `theirs` both define but define differently.
pub fn disagreements(ours: &Contract, theirs: &Contract) -> Vec<Finding> {
    let mut out = Vec::new();
    for their_message in messages(theirs) {
        let Some(our_message) = ours.pool.get_message_by_name(their_message.full_name()) else {
            continue;
        };
        for their_field in their_message.fields() {
            if let Some(our_field) = our_message.get_field(their_field.number()) {
                let at = format!(
                    "{}.{} = {}",
                    their_message.name(),
                    their_field.name(),
                    their_field.number()
                );
                for problem in field_problems(&our_field, &their_field, theirs) {
                    out.push(format!("{} vs {}: {at}: {problem}", ours.label, theirs.label));
                }
            }
        }
        // The same field name under another number is a moved field.
        for our_field in our_message.fields() {
            if let Some(their_field) = their_message.get_field_by_name(our_field.name())
                && their_field.number() != our_field.number()
            {
                out.push(format!(
                    "{} vs {}: {}.{}: number {} here, {} there",
                    ours.label,
                    theirs.label,
                    our_message.name(),
                    our_field.name(),
                    our_field.number(),
                    their_field.number()
                ));
            }
        }
    }
    for their_enum in enums(theirs) {
        if let Some(our_enum) = ours.pool.get_enum_by_name(their_enum.full_name()) {
            for problem in enum_problems(&our_enum, &their_enum) {
                out.push(format!(
                    "{} vs {}: enum {}: {problem}",
                    ours.label,
                    theirs.label,
                    their_enum.name()
                ));
            }
        }
    }
    for their_service in services(theirs) {
        let Some(our_service) = ours.pool.get_service_by_name(their_service.full_name()) else {
            continue;
        };
        for their_method in their_service.methods() {
            let Some(our_method) = our_service.methods().find(|m| m.name() == their_method.name())
            else {
                continue;
            };
            let signature = |m: &protox::prost_reflect::MethodDescriptor| {
                format!(
                    "({}{}) returns ({}{})",
                    if m.is_client_streaming() { "stream " } else { "" },
                    m.input().full_name(),
                    if m.is_server_streaming() { "stream " } else { "" },
                    m.output().full_name()
                )
            };
            let (here, there) = (signature(&our_method), signature(&their_method));
            if here != there {
                out.push(format!(
                    "{} vs {}: rpc {}: {here} here, {there} there",
                    ours.label,
                    theirs.label,
                    their_method.name()
                ));
            }
        }
    }
    out
}

/// What `theirs` defines (messages, fields, enum values, RPCs) that `ours` lacks.
pub fn missing(ours: &Contract, theirs: &Contract) -> Vec<Finding> {
    let mut out = Vec::new();
    let lacks =
        |what: String| format!("{} lacks {what}, which {} defines", ours.label, theirs.label);
    for their_message in messages(theirs) {
        let Some(our_message) = ours.pool.get_message_by_name(their_message.full_name()) else {
            out.push(lacks(format!("message {}", their_message.name())));
            continue;
        };
        for field in their_message.fields() {
            if our_message.get_field(field.number()).is_none() {
                out.push(lacks(format!(
                    "{}.{} = {}",
                    their_message.name(),
                    field.name(),
                    field.number()
                )));
            }
        }
    }
    for their_enum in enums(theirs) {
        let Some(our_enum) = ours.pool.get_enum_by_name(their_enum.full_name()) else {
            out.push(lacks(format!("enum {}", their_enum.name())));
            continue;
        };
        for value in their_enum.values() {
            if our_enum.get_value(value.number()).is_none() {
                out.push(lacks(format!(
                    "{}.{} = {}",
                    their_enum.name(),
                    value.name(),
                    value.number()
                )));
            }
        }
    }
    for their_service in services(theirs) {
        let Some(our_service) = ours.pool.get_service_by_name(their_service.full_name()) else {
            out.push(lacks(format!("service {}", their_service.name())));
            continue;
        };
        for method in their_service.methods() {
            if !our_service.methods().any(|m| m.name() == method.name()) {
                out.push(lacks(format!("rpc {}", method.name())));
            }
        }
    }
    out
}

/// What `ours` defines that none of `references` defines the same way: a field number, enum
/// value or RPC of our own. A message of ours that no reference names (our `LegacyDuration`)
/// must serve only as the type of fields whose layout was checked against a reference.
pub fn private(ours: &Contract, references: &[&Contract]) -> Vec<Finding> {
    let mut out = Vec::new();
    let known_in = |full_name: &str| {
        references.iter().any(|r| r.pool.get_message_by_name(full_name).is_some())
    };
    for our_message in messages(ours) {
        if !known_in(our_message.full_name()) {
            let users: Vec<FieldDescriptor> = messages(ours)
                .flat_map(|m| m.fields().collect::<Vec<_>>())
                .filter(|f| matches!(f.kind(), Kind::Message(m) if m.full_name() == our_message.full_name()))
                .collect();
            if users.is_empty() || users.iter().any(|f| !known_in(f.parent_message().full_name())) {
                out.push(format!(
                    "{}: message {} is not upstream's, and not only the type of upstream fields",
                    ours.label,
                    our_message.name()
                ));
            }
            continue;
        }
        for field in our_message.fields() {
            let mut differences = Vec::new();
            let mut same_upstream = false;
            for reference in references {
                let theirs = reference
                    .pool
                    .get_message_by_name(our_message.full_name())
                    .and_then(|m| m.get_field(field.number()));
                if let Some(theirs) = theirs {
                    let problems = field_problems(&field, &theirs, reference);
                    same_upstream |= problems.is_empty();
                    differences.push(format!("{}: {}", reference.label, problems.join(", ")));
                }
            }
            let at = format!("{}.{} = {}", our_message.name(), field.name(), field.number());
            if same_upstream {
                continue;
            }
            if differences.is_empty() {
                out.push(format!(
                    "{}: {at} is defined by none of {}",
                    ours.label,
                    labels(references)
                ));
            } else {
                out.push(format!(
                    "{}: {at} is defined otherwise upstream ({})",
                    ours.label,
                    differences.join("; ")
                ));
            }
        }
    }
    for our_enum in enums(ours) {
        for value in our_enum.values() {
            let same_upstream = references.iter().any(|r| {
                r.pool
                    .get_enum_by_name(our_enum.full_name())
                    .and_then(|e| e.get_value(value.number()))
                    .is_some_and(|theirs| theirs.name() == value.name())
            });
            if !same_upstream {
                out.push(format!(
                    "{}: {}.{} = {} is defined by none of {}",
                    ours.label,
                    our_enum.name(),
                    value.name(),
                    value.number(),
                    labels(references)
                ));
            }
        }
    }
    for our_service in services(ours) {
        for method in our_service.methods() {
            let upstream = references.iter().any(|r| {
                r.pool
                    .get_service_by_name(our_service.full_name())
                    .is_some_and(|s| s.methods().any(|m| m.name() == method.name()))
            });
            if !upstream {
                out.push(format!(
                    "{}: rpc {} is defined by none of {}",
                    ours.label,
                    method.name(),
                    labels(references)
                ));
            }
        }
    }
    out
}

fn labels(references: &[&Contract]) -> String {
    references.iter().map(|r| r.label.as_str()).collect::<Vec<_>>().join(", ")
}

/// The contract's own messages (nested ones included, map entries left to their fields).
fn messages(contract: &Contract) -> impl Iterator<Item = MessageDescriptor> + '_ {
    contract.pool.all_messages().filter(|m| m.package_name() == PACKAGE && !m.is_map_entry())
}

fn enums(contract: &Contract) -> impl Iterator<Item = EnumDescriptor> + '_ {
    contract.pool.all_enums().filter(|e| e.package_name() == PACKAGE)
}

fn services(contract: &Contract) -> impl Iterator<Item = ServiceDescriptor> + '_ {
    contract.pool.services().filter(|s| s.package_name() == PACKAGE)
}

/// How two fields of the same number differ, if they do.
fn field_problems(
    ours: &FieldDescriptor,
    theirs: &FieldDescriptor,
    their_contract: &Contract,
) -> Vec<String> {
    let mut problems = Vec::new();
    if ours.name() != theirs.name() {
        problems.push(format!("named {} here", ours.name()));
    }
    if label(ours) != label(theirs) {
        problems.push(format!("{} here, {} there", label(ours), label(theirs)));
    }
    let mut seen = BTreeSet::new();
    if let Err(why) = same_type(&ours.kind(), &theirs.kind(), their_contract, &mut seen) {
        problems.push(why);
    }
    problems
}

fn label(field: &FieldDescriptor) -> &'static str {
    if field.is_map() {
        "map"
    } else {
        match field.cardinality() {
            Cardinality::Optional => "singular",
            Cardinality::Required => "required",
            Cardinality::Repeated => "repeated",
        }
    }
}

fn type_name(kind: &Kind) -> String {
    match kind {
        Kind::Message(m) => m.full_name().to_owned(),
        Kind::Enum(e) => e.full_name().to_owned(),
        scalar => format!("{scalar:?}").to_lowercase(),
    }
}

/// Whether two field types put the same thing on the wire; `Err` says how they differ.
fn same_type(
    ours: &Kind,
    theirs: &Kind,
    their_contract: &Contract,
    seen: &mut BTreeSet<(String, String)>,
) -> Result<(), String> {
    let differ = || Err(format!("type {} here, {} there", type_name(ours), type_name(theirs)));
    match (ours, theirs) {
        (Kind::Message(a), Kind::Message(b)) => {
            // A message of the contract is compared on its own, and a well-known type is the
            // same everywhere; a map entry is compared here, as part of its field.
            if a.full_name() == b.full_name() && !a.is_map_entry() {
                return Ok(());
            }
            if !seen.insert((a.full_name().to_owned(), b.full_name().to_owned())) {
                return Ok(());
            }
            same_layout(a, b, their_contract, seen).map_err(|why| {
                format!("type {} here, {} there: {why}", a.full_name(), b.full_name())
            })
        }
        (Kind::Bytes, Kind::Message(b)) if their_contract.opaque.contains(b.full_name()) => Ok(()),
        (Kind::Enum(a), Kind::Enum(b)) => {
            let problems = enum_problems(a, b);
            if a.full_name() == b.full_name() || problems.is_empty() { Ok(()) } else { differ() }
        }
        (a, b) if a == b && !matches!(a, Kind::Message(_) | Kind::Enum(_)) => Ok(()),
        _ => differ(),
    }
}

/// Two messages of different names with the same fields, number for number.
fn same_layout(
    ours: &MessageDescriptor,
    theirs: &MessageDescriptor,
    their_contract: &Contract,
    seen: &mut BTreeSet<(String, String)>,
) -> Result<(), String> {
    let numbers = |m: &MessageDescriptor| m.fields().map(|f| f.number()).collect::<BTreeSet<_>>();
    if numbers(ours) != numbers(theirs) {
        return Err(format!("fields {:?} here, {:?} there", numbers(ours), numbers(theirs)));
    }
    for our_field in ours.fields() {
        let Some(their_field) = theirs.get_field(our_field.number()) else { continue };
        if our_field.name() != their_field.name() || label(&our_field) != label(&their_field) {
            return Err(format!(
                "field {} is {} {} here, {} {} there",
                our_field.number(),
                label(&our_field),
                our_field.name(),
                label(&their_field),
                their_field.name()
            ));
        }
        same_type(&our_field.kind(), &their_field.kind(), their_contract, seen)
            .map_err(|why| format!("field {}: {why}", our_field.name()))?;
    }
    Ok(())
}

/// How two enums of the same meaning differ: a number named otherwise, or a name numbered
/// otherwise.
fn enum_problems(ours: &EnumDescriptor, theirs: &EnumDescriptor) -> Vec<String> {
    let mut problems = Vec::new();
    for value in theirs.values() {
        if let Some(our_value) = ours.get_value(value.number())
            && our_value.name() != value.name()
        {
            problems.push(format!(
                "{} is {} here, {} there",
                value.number(),
                our_value.name(),
                value.name()
            ));
        }
        if let Some(our_value) = ours.get_value_by_name(value.name())
            && our_value.number() != value.number()
        {
            problems.push(format!(
                "{} is {} here, {} there",
                value.name(),
                our_value.number(),
                value.number()
            ));
        }
    }
    problems
}
