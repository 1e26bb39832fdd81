//! A gate read from Prometheus: an instant query, open while it returns at least one sample.

use crate::api::PrometheusGate;

use super::Verdict;

/// How many samples a reading quotes.
const QUOTED: usize = 3;

/// Runs the gate's query and judges the answer; a closed gate quotes its `explain` query too.
pub async fn read(http: &reqwest::Client, gate: &PrometheusGate) -> (Verdict, String) {
    let (verdict, said) = ask(http, &gate.url, &gate.query).await;
    let Some(explain) = gate.explain.as_deref().filter(|_| verdict == Verdict::Closed) else {
        return (verdict, said);
    };
    match ask(http, &gate.url, explain).await {
        (Verdict::Open, words) => (verdict, format!("{said}; {words}")),
        (_, words) => (verdict, format!("{said} ({words})")),
    }
}

/// Runs one instant query and judges the answer.
async fn ask(http: &reqwest::Client, base: &str, query: &str) -> (Verdict, String) {
    let url = format!("{}/api/v1/query", base.trim_end_matches('/'));
    let sent = http.get(&url).query(&[("query", query)]).send().await;
    let response = match sent {
        Ok(response) => response,
        Err(e) => {
            return (Verdict::Unread, format!("Prometheus at {base} did not answer: {e}"));
        }
    };
    let status = response.status();
    match response.text().await {
        Ok(body) => judge(query, status.as_u16(), &body),
        Err(e) => (Verdict::Unread, format!("Prometheus at {base} answered {status}, unread: {e}")),
    }
}

/// Judges Prometheus's answer to `query` (the HTTP status and body of `/api/v1/query`). Pure.
pub fn judge(query: &str, status: u16, body: &str) -> (Verdict, String) {
    let answer: serde_json::Value = match serde_json::from_str(body) {
        Ok(answer) => answer,
        Err(e) => {
            let start: String = body.chars().take(200).collect();
            return (
                Verdict::Unread,
                format!(
                    "Prometheus answered {status} with what is not its API's JSON ({e}): {start}"
                ),
            );
        }
    };
    if answer["status"] != "success" {
        let error = answer["error"].as_str().unwrap_or("no error given");
        return (Verdict::Unread, format!("Prometheus refused the query {query}: {error}"));
    }
    let data = &answer["data"];
    let samples: Vec<String> = match data["resultType"].as_str() {
        Some("vector") => data["result"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|series| describe(&series["metric"], &series["value"]))
            .collect(),
        // A scalar is a sample with no labels, open unless it is zero: `vector(1)`-style
        // answers (`scalar(...)`) read as what they say.
        Some("scalar") if data["result"][1].as_str().is_some_and(|v| v.parse() != Ok(0.0)) => {
            vec![describe(&serde_json::Value::Null, &data["result"])]
        }
        Some("scalar") => Vec::new(),
        other => {
            return (
                Verdict::Unread,
                format!(
                    "the query {query} answers a {}, not an instant vector",
                    other.unwrap_or("nothing")
                ),
            );
        }
    };
    if samples.is_empty() {
        return (Verdict::Closed, format!("the query {query} returned no sample"));
    }
    let quoted: Vec<&str> = samples.iter().take(QUOTED).map(String::as_str).collect();
    let more = samples.len().saturating_sub(QUOTED);
    let more = if more > 0 { format!(" and {more} more") } else { String::new() };
    (Verdict::Open, format!("the query {query} returned {}{more}", quoted.join(", ")))
}

/// One sample as PromQL writes it: `name{label="value"} = value`.
fn describe(metric: &serde_json::Value, value: &serde_json::Value) -> String {
    let labels = metric.as_object();
    let name = labels.and_then(|l| l.get("__name__")).and_then(|n| n.as_str()).unwrap_or_default();
    let pairs: Vec<String> = labels
        .into_iter()
        .flatten()
        .filter(|(key, _)| key.as_str() != "__name__")
        .map(|(key, v)| format!("{key}={}", v))
        .collect();
    let value = value[1].as_str().unwrap_or("?");
    if pairs.is_empty() && name.is_empty() {
        value.to_owned()
    } else if pairs.is_empty() {
        format!("{name} = {value}")
    } else {
        format!("{name}{{{}}} = {value}", pairs.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_is_open_while_it_returns_a_sample() {
        let q = "ceph_health_status == 0";
        let healthy = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"ceph_health_status","instance":"mgr:9283"},"value":[1.5,"0"]}]}}"#;
        let (verdict, said) = judge(q, 200, healthy);
        assert_eq!(verdict, Verdict::Open);
        assert_eq!(
            said,
            r#"the query ceph_health_status == 0 returned ceph_health_status{instance="mgr:9283"} = 0"#
        );
        let degraded = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        assert_eq!(
            judge(q, 200, degraded),
            (Verdict::Closed, format!("the query {q} returned no sample"))
        );
    }

    #[test]
    fn a_scalar_counts_unless_zero() {
        let one = r#"{"status":"success","data":{"resultType":"scalar","result":[1.5,"1"]}}"#;
        assert_eq!(judge("scalar(x)", 200, one).0, Verdict::Open);
        let zero = r#"{"status":"success","data":{"resultType":"scalar","result":[1.5,"0"]}}"#;
        assert_eq!(judge("scalar(x)", 200, zero).0, Verdict::Closed);
    }

    #[test]
    fn what_cannot_be_judged_holds() {
        let refused = r#"{"status":"error","errorType":"bad_data","error":"1:5: parse error: unexpected end of input"}"#;
        let (verdict, said) = judge("up ==", 400, refused);
        assert_eq!(verdict, Verdict::Unread);
        assert!(said.contains("refused the query up ==: 1:5: parse error"), "{said}");
        let (verdict, said) = judge("up", 502, "<html>Bad Gateway</html>");
        assert_eq!(verdict, Verdict::Unread);
        assert!(said.contains("answered 502"), "{said}");
        let matrix = r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        assert_eq!(judge("up[5m]", 200, matrix).0, Verdict::Unread);
    }

    #[test]
    fn long_answers_are_cut() {
        let series: Vec<String> =
            (0..5).map(|i| format!(r#"{{"metric":{{"v":"{i}"}},"value":[1,"1"]}}"#)).collect();
        let body = format!(
            r#"{{"status":"success","data":{{"resultType":"vector","result":[{}]}}}}"#,
            series.join(",")
        );
        let (_, said) = judge("x", 200, &body);
        assert!(said.ends_with("and 2 more"), "{said}");
    }
}
