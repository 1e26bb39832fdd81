//! The two ways YAML is read: as Go reads it (kubectl, Helm and the apiserver's clients, in the
//! YAML 1.1 style where an unquoted `on`, `off`, `yes`, `no`, `y` or `n` is a boolean) and as a
//! YAML 1.2 reader does (where those are strings). A manifest is safe to ship only when both
//! readers get the same objects from it.

use std::path::Path;

use anyhow::{Context, Result, ensure};
use serde_json::Value;

use crate::binaries::{Profile, binaries};

/// An annotation kubectl adds while reading, taken off again: `annotate --local` is the kubectl
/// command that reads a file and prints it as JSON without a cluster or the kinds' schemas.
const READ_MARK: &str = "homelab.test/read-by-kubectl";

/// Every object of the (multi-document) YAML file `path`, as kubectl reads it, in JSON.
pub async fn read_as_go(path: &Path) -> Result<Vec<Value>> {
    let kubectl = binaries(Profile::Integration).await?.path("kubectl");
    let shown = path.display().to_string();
    let out = tokio::process::Command::new(&kubectl)
        .args(["annotate", "--local", "--kubeconfig=/dev/null", "-o", "json", "-f", &shown])
        .arg(format!("{READ_MARK}=yes"))
        .env_clear()
        .output()
        .await
        .with_context(|| format!("running kubectl on {shown}"))?;
    ensure!(
        out.status.success(),
        "kubectl reading {shown}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut objects = Vec::new();
    for object in serde_json::Deserializer::from_slice(&out.stdout).into_iter() {
        let object: Value = object.with_context(|| format!("kubectl's JSON for {shown}"))?;
        // Several objects come back as one List.
        let items = match object.get("kind").and_then(Value::as_str) {
            Some("List") => {
                object.get("items").and_then(Value::as_array).cloned().unwrap_or_default()
            }
            _ => vec![object],
        };
        objects.extend(items.into_iter().map(unmark));
    }
    Ok(objects)
}

/// The Helm values file `path` as Helm reads it (in JSON), through a chart of one template that
/// prints `.Values`: the way the file reaches a chart it is given to.
pub async fn read_values_as_helm(path: &Path) -> Result<Value> {
    let helm = binaries(Profile::E2e).await?.path("helm");
    let chart = tempfile::tempdir().context("a temporary chart")?;
    std::fs::write(
        chart.path().join("Chart.yaml"),
        "apiVersion: v2\nname: values\nversion: 0.0.0\n",
    )?;
    std::fs::create_dir(chart.path().join("templates"))?;
    std::fs::write(chart.path().join("templates/values.json"), "{{ toJson .Values }}\n")?;
    let shown = path.display().to_string();
    let out = tokio::process::Command::new(&helm)
        .arg("template")
        .arg("values")
        .arg(chart.path())
        .args(["-f", &shown])
        .env_clear()
        .env("HOME", chart.path())
        .output()
        .await
        .with_context(|| format!("running helm on {shown}"))?;
    ensure!(out.status.success(), "helm reading {shown}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let json = text.lines().filter(|line| !line.starts_with('#') && line.trim() != "---");
    serde_json::from_str(&json.collect::<Vec<_>>().join("\n"))
        .with_context(|| format!("helm's JSON for {shown}"))
}

/// `object` without the annotation kubectl was asked to add.
fn unmark(mut object: Value) -> Value {
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        let now_empty = metadata.get_mut("annotations").and_then(Value::as_object_mut).is_some_and(
            |annotations| {
                annotations.remove(READ_MARK);
                annotations.is_empty()
            },
        );
        if now_empty {
            metadata.remove("annotations");
        }
    }
    object
}

/// Every document of `text` as a YAML 1.2 reader takes it, empty documents left out. Only
/// `true` and `false` are booleans there (serde-saphyr accepts the 1.1 spellings unless told).
pub fn read_as_yaml_1_2(text: &str) -> Result<Vec<Value>> {
    let options = serde_saphyr::options! { strict_booleans: true };
    let documents: Vec<Value> =
        serde_saphyr::from_multiple_with_options(text, options).context("reading YAML 1.2")?;
    Ok(documents.into_iter().filter(|document| !document.is_null()).collect())
}

/// Where `go` and `yaml_1_2` differ, as JSON paths with both values: a value of another type,
/// another scalar, or a key only one of them has. Numbers compare by value (`1` and `1.0`).
pub fn differences(go: &Value, yaml_1_2: &Value) -> Vec<String> {
    let mut found = Vec::new();
    compare("", go, yaml_1_2, &mut found);
    found
}

fn compare(path: &str, go: &Value, yaml_1_2: &Value, found: &mut Vec<String>) {
    match (go, yaml_1_2) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in b {
                match a.get(key) {
                    Some(other) => compare(&format!("{path}.{key}"), other, value, found),
                    None => found.push(format!("{path}.{key}: missing when Go reads it")),
                }
            }
            for key in a.keys().filter(|key| !b.contains_key(*key)) {
                found.push(format!("{path}.{key}: only Go reads this key (a boolean key?)"));
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                compare(&format!("{path}[{i}]"), x, y, found);
            }
        }
        (Value::Number(a), Value::Number(b)) if a.as_f64() == b.as_f64() => {}
        (a, b) if a == b => {}
        (a, b) => found.push(format!("{path}: Go reads {a}, YAML 1.2 reads {b}")),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn differences_name_the_path_and_both_readings() {
        let cases = [
            (json!({"a": [1, "on"]}), json!({"a": [1.0, "on"]}), vec![]),
            (
                json!({"a": true}),
                json!({"a": "on"}),
                vec![".a: Go reads true, YAML 1.2 reads \"on\""],
            ),
            (
                json!({"true": 1}),
                json!({"on": 1}),
                vec![
                    ".on: missing when Go reads it",
                    ".true: only Go reads this key (a boolean key?)",
                ],
            ),
            (json!([1]), json!([1, 2]), vec![": Go reads [1], YAML 1.2 reads [1,2]"]),
        ];
        for (go, yaml_1_2, expected) in cases {
            assert_eq!(differences(&go, &yaml_1_2), expected, "{go} against {yaml_1_2}");
        }
    }
}
