//! A gate read from Kubernetes objects: a CEL expression over the objects of any kind, open
//! while it is true. The kind is found through discovery, as `kubectl get` finds it.

use std::panic::{AssertUnwindSafe, catch_unwind};

use kube::api::{Api, DynamicObject, ListParams};
use kube::core::GroupVersionKind;

use crate::api::KubernetesGate;

use super::Verdict;

/// Reads the gate's objects and evaluates its expression over them.
pub async fn read(client: &kube::Client, gate: &KubernetesGate) -> (Verdict, String) {
    match objects(client, gate).await {
        Ok(objects) => judge(gate, &objects),
        Err(said) => (Verdict::Unread, said),
    }
}

/// What the gate names, as JSON objects (one when it names an object).
async fn objects(
    client: &kube::Client,
    gate: &KubernetesGate,
) -> Result<Vec<serde_json::Value>, String> {
    let (group, version) = match gate.api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", gate.api_version.as_str()),
    };
    let gvk = GroupVersionKind::gvk(group, version, &gate.kind);
    let what = format!("{} {}", gate.api_version, gate.kind);
    let (resource, _) =
        tokio::time::timeout(super::READ_TIMEOUT, kube::discovery::pinned_kind(client, &gvk))
            .await
            .map_err(|_| format!("the API server did not say what {what} is in time"))?
            .map_err(|e| format!("the API server does not serve {what}: {e}"))?;
    let api: Api<DynamicObject> = match &gate.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let place =
        gate.namespace.as_deref().map(|ns| format!(" in namespace {ns}")).unwrap_or_default();
    let found = match &gate.name {
        Some(name) => tokio::time::timeout(super::READ_TIMEOUT, api.get_opt(name))
            .await
            .map_err(|_| format!("reading {what} {name}{place} timed out"))?
            .map_err(|e| format!("reading {what} {name}{place}: {e}"))?
            .map(|o| vec![o])
            .ok_or_else(|| format!("{what} {name} does not exist{place}"))?,
        None => {
            let mut params = ListParams::default();
            if let Some(selector) = &gate.label_selector {
                params = params.labels(selector);
            }
            tokio::time::timeout(super::READ_TIMEOUT, api.list(&params))
                .await
                .map_err(|_| format!("listing {what}{place} timed out"))?
                .map_err(|e| format!("listing {what}{place}: {e}"))?
                .items
        }
    };
    found
        .into_iter()
        .map(|o| serde_json::to_value(o).map_err(|e| format!("reading {what}: {e}")))
        .collect()
}

/// Evaluates the gate's expression over `objects`: `objects` is the list, and `object` the one
/// object when the gate names one. Pure.
pub fn judge(gate: &KubernetesGate, objects: &[serde_json::Value]) -> (Verdict, String) {
    let object = gate.name.as_ref().and(objects.first());
    let expression = &gate.expression;
    let read = match &gate.name {
        Some(name) => format!("{} {name}", gate.kind),
        None => format!("{} {}", objects.len(), gate.kind),
    };
    match evaluate(expression, objects, object) {
        Ok(true) => (Verdict::Open, format!("{expression} is true of {read}")),
        Ok(false) => (Verdict::Closed, format!("{expression} is false of {read}")),
        Err(e) => {
            (Verdict::Unread, format!("{expression} could not be evaluated over {read}: {e}"))
        }
    }
}

/// Whether `expression` compiles, for admission: the error a person should see, if not.
pub fn compile_error(expression: &str) -> Option<String> {
    match catch_unwind(|| cel::Program::compile(expression)) {
        Ok(Ok(_)) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some("the expression could not be parsed".into()),
    }
}

fn evaluate(
    expression: &str,
    objects: &[serde_json::Value],
    object: Option<&serde_json::Value>,
) -> Result<bool, String> {
    // The evaluator is a library's; an expression it cannot handle must hold the gate, never
    // take the controller down.
    let run = || -> Result<bool, String> {
        let program = cel::Program::compile(expression).map_err(|e| e.to_string())?;
        let mut context = cel::Context::default();
        context.add_variable("objects", objects).map_err(|e| e.to_string())?;
        if let Some(object) = object {
            context.add_variable("object", object).map_err(|e| e.to_string())?;
        }
        match program.execute(&context).map_err(|e| e.to_string())? {
            cel::Value::Bool(value) => Ok(value),
            other => Err(format!("it is {other:?}, not true or false")),
        }
    };
    catch_unwind(AssertUnwindSafe(run)).unwrap_or_else(|_| Err("the evaluator failed".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gate(name: Option<&str>, expression: &str) -> KubernetesGate {
        KubernetesGate {
            api_version: "longhorn.io/v1beta2".into(),
            kind: "Volume".into(),
            namespace: Some("longhorn-system".into()),
            name: name.map(Into::into),
            label_selector: None,
            expression: expression.into(),
        }
    }

    #[test]
    fn an_expression_over_every_object() {
        let all_healthy = gate(None, "objects.all(v, v.status.robustness == 'healthy')");
        let volumes = [
            json!({ "status": { "robustness": "healthy" } }),
            json!({ "status": { "robustness": "degraded" } }),
        ];
        let (verdict, said) = judge(&all_healthy, &volumes);
        assert_eq!(verdict, Verdict::Closed);
        assert_eq!(said, "objects.all(v, v.status.robustness == 'healthy') is false of 2 Volume");
        assert_eq!(judge(&all_healthy, &volumes[..1]).0, Verdict::Open);
    }

    #[test]
    fn an_expression_over_one_object() {
        let ok = gate(Some("rook-ceph"), "object.status.ceph.health == 'HEALTH_OK'");
        let cluster = json!({ "status": { "ceph": { "health": "HEALTH_WARN" } } });
        let (verdict, said) = judge(&ok, std::slice::from_ref(&cluster));
        assert_eq!(verdict, Verdict::Closed);
        assert!(said.ends_with("is false of Volume rook-ceph"), "{said}");
    }

    #[test]
    fn what_cannot_be_evaluated_holds() {
        let missing_field = gate(Some("v"), "object.status.robustness == 'healthy'");
        let (verdict, said) = judge(&missing_field, &[json!({ "spec": {} })]);
        assert_eq!(verdict, Verdict::Unread, "{said}");
        let not_bool = gate(None, "size(objects)");
        let (verdict, said) = judge(&not_bool, &[]);
        assert_eq!(verdict, Verdict::Unread);
        assert!(said.contains("not true or false"), "{said}");
        assert_eq!(judge(&gate(None, "objects.("), &[]).0, Verdict::Unread);
    }

    #[test]
    fn admission_reads_the_compile_error() {
        assert_eq!(compile_error("object.status.ready == true"), None);
        let error = compile_error("object.status.(").expect("refused");
        assert!(error.contains("Syntax error"), "{error}");
    }
}
