//! A real Prometheus scraping the operator's `/metrics` every second, queried through its HTTP
//! API, and promtool's linter of the exposition format. Both are built from their pinned
//! module by build-binaries.sh (the `e2e` profile).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};

use super::{free_port, http_get};
use crate::binaries::{Profile, binaries};
use crate::eventually;

/// One series of an instant query's answer: its labels and value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A Prometheus server that lives as long as this value.
pub struct Prometheus {
    _child: Child,
    addr: String,
    log: PathBuf,
    _data: tempfile::TempDir,
}

impl Prometheus {
    /// Starts Prometheus with one scrape job, `homelab-autoscaler`, on `targets` (host:port of
    /// the operators' admin listeners), scraped every second; waits until it is ready.
    pub async fn start(targets: &[String], logs: &Path) -> Result<Prometheus> {
        let bin = binaries(Profile::E2e).await?.path("prometheus");
        let data = tempfile::tempdir().context("a directory for Prometheus")?;
        let config = data.path().join("prometheus.yml");
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: homelab-autoscaler\n    static_configs:\n      \
                 - targets: [{}]\n",
                targets.join(", ")
            ),
        )?;
        let port = free_port()?;
        let addr = format!("127.0.0.1:{port}");
        std::fs::create_dir_all(logs)?;
        let log = logs.join("prometheus.log");
        let out = std::fs::File::create(&log)?;
        let child = Command::new(&bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", data.path().join("tsdb").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone()?))
            .stderr(Stdio::from(out))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let prometheus = Prometheus { _child: child, addr, log, _data: data };
        eventually("Prometheus to be ready", Duration::from_secs(60), || {
            http_get(&prometheus.addr, "/-/ready")
        })
        .await
        .with_context(|| prometheus.log_tail(30))?;
        Ok(prometheus)
    }

    /// Its base URL, as a client names it.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The last lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        crate::process::file_tail(&self.log, lines)
    }

    /// Runs an instant PromQL query; a scalar answer is one sample without labels.
    pub async fn query(&self, expr: &str) -> Result<Vec<Sample>> {
        let body = http_get(&self.addr, &format!("/api/v1/query?query={}", url_encode(expr)))
            .await
            .with_context(|| format!("querying {expr}"))?;
        parse_answer(&body).with_context(|| format!("the answer to {expr}: {body}"))
    }

    /// The sum of `expr`'s samples, once it has any (the first scrapes may still be coming).
    pub async fn value(&self, expr: &str) -> Result<f64> {
        let samples = self.query(expr).await?;
        ensure!(!samples.is_empty(), "{expr} has no data yet");
        Ok(samples.iter().map(|s| s.value).sum())
    }
}

fn parse_answer(body: &str) -> Result<Vec<Sample>> {
    let answer: serde_json::Value = serde_json::from_str(body)?;
    ensure!(answer["status"] == "success", "the query failed");
    let data = &answer["data"];
    let value = |v: &serde_json::Value| -> Result<f64> {
        let text = v[1].as_str().context("a sample value")?;
        Ok(match text {
            "NaN" => f64::NAN,
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            other => other.parse()?,
        })
    };
    match data["resultType"].as_str() {
        Some("vector") => data["result"]
            .as_array()
            .context("a result list")?
            .iter()
            .map(|series| {
                let labels = serde_json::from_value(series["metric"].clone())?;
                Ok(Sample { labels, value: value(&series["value"])? })
            })
            .collect(),
        Some("scalar") => {
            Ok(vec![Sample { labels: BTreeMap::new(), value: value(&data["result"])? }])
        }
        other => bail!("an unexpected result type {other:?}"),
    }
}

/// Percent-encodes a query parameter.
fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `promtool check metrics` on an exposition: Ok with its output when it finds nothing, else an
/// error with what it found.
pub async fn promtool_check_metrics(exposition: &str) -> Result<String> {
    let bin = binaries(Profile::E2e).await?.path("promtool");
    let mut child = Command::new(&bin)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut stdin = child.stdin.take().context("promtool's stdin")?;
    stdin.write_all(exposition.as_bytes()).await?;
    drop(stdin);
    let out = child.wait_with_output().await?;
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success(), "promtool check metrics ({}):\n{text}", out.status);
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_parse() {
        let vector = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"phase":"ready"},"value":[1.5,"3"]},{"metric":{},"value":[1.5,"NaN"]}]}}"#;
        let samples = parse_answer(vector).unwrap();
        assert_eq!(samples[0].labels["phase"], "ready");
        assert_eq!(samples[0].value, 3.0);
        assert!(samples[1].value.is_nan());
        let scalar = r#"{"status":"success","data":{"resultType":"scalar","result":[1.5,"2"]}}"#;
        assert_eq!(parse_answer(scalar).unwrap()[0].value, 2.0);
        assert!(parse_answer(r#"{"status":"error","error":"bad"}"#).is_err());
    }

    #[test]
    fn queries_are_encoded() {
        assert_eq!(url_encode(r#"sum(x{a=~"b"})"#), "sum%28x%7Ba%3D~%22b%22%7D%29");
    }
}
