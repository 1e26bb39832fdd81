//! kube-apiserver's own view of a create: its `/metrics` histograms read before and after an arm,
//! so the difference of each histogram's sum and count is the mean of what that arm added. Beside
//! it, the handlers' own histogram in this process (the webhook server runs here), and which TCP
//! connections reached the webhook server (from `/proc/net/tcp`), to tell whether the apiserver
//! keeps its connections to a webhook open.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context as _, Result};
use kube::Client;

/// The histograms read: every series' `(sum, count)`, keyed by `name{labels}`.
#[derive(Default)]
pub struct Scrape(BTreeMap<String, (f64, f64)>);

/// The histograms that decompose a create (each as `<name>_sum` and `<name>_count`).
const HISTOGRAMS: [&str; 5] = [
    "apiserver_request_duration_seconds",
    "apiserver_admission_step_admission_duration_seconds",
    "apiserver_admission_controller_admission_duration_seconds",
    "apiserver_admission_webhook_admission_duration_seconds",
    "etcd_request_duration_seconds",
];

/// One line of the decomposition: a histogram and the labels its series must carry.
pub struct Row {
    pub title: &'static str,
    histogram: String,
    labels: Vec<(&'static str, &'static str)>,
}

/// From the outside in: the whole request as the apiserver times it, its two admission steps
/// (every plugin of the step), the webhook plugin of each, each webhook call (the review built,
/// the HTTPS round trip, the response read and a patch applied), and the write to etcd.
pub fn create_rows(stamp: &'static str, validate: &'static str) -> Vec<Row> {
    let row = |title, histogram: &str, labels: &[(&'static str, &'static str)]| Row {
        title,
        histogram: histogram.to_owned(),
        labels: labels.to_vec(),
    };
    let (step, plugin, webhook) = (
        "apiserver_admission_step_admission_duration_seconds",
        "apiserver_admission_controller_admission_duration_seconds",
        "apiserver_admission_webhook_admission_duration_seconds",
    );
    let create = [("operation", "CREATE"), ("rejected", "false")];
    let with = |extra: (&'static str, &'static str)| {
        let mut labels = create.to_vec();
        labels.push(extra);
        labels
    };
    vec![
        row(
            "POST nodeclaims, the whole request",
            "apiserver_request_duration_seconds",
            &[("verb", "POST"), ("resource", "nodeclaims"), ("subresource", ""), ("dry_run", "")],
        ),
        row("mutating admission (every plugin)", step, &with(("type", "admit"))),
        row("MutatingAdmissionWebhook plugin", plugin, &with(("name", "MutatingAdmissionWebhook"))),
        row("the stamp webhook's call", webhook, &with(("name", stamp))),
        row("validating admission (every plugin)", step, &with(("type", "validate"))),
        row(
            "ValidatingAdmissionWebhook plugin",
            plugin,
            &with(("name", "ValidatingAdmissionWebhook")),
        ),
        row("the claim rule's webhook call", webhook, &with(("name", validate))),
        row(
            "etcd create of a NodeClaim",
            "etcd_request_duration_seconds",
            &[
                ("operation", "create"),
                ("group", "infra.homecluster.dev"),
                ("resource", "nodeclaims"),
            ],
        ),
    ]
}

/// The product's own histogram of the time its handlers take, from the review parsed to the
/// verdict (`telemetry::webhook_answered`), for the two claim webhooks.
pub fn own_rows() -> Vec<Row> {
    let histogram = own_histogram();
    vec![
        Row {
            title: "/mutate/nodeclaims, review parsed to verdict",
            histogram: histogram.clone(),
            labels: vec![("webhook", "mutate-nodeclaim")],
        },
        Row {
            title: "/validate/nodeclaims, review parsed to verdict",
            histogram,
            labels: vec![("webhook", "validate-nodeclaim")],
        },
    ]
}

fn own_histogram() -> String {
    format!("{}_webhook_request_duration_seconds", homelab_autoscaler::telemetry::PREFIX)
}

/// Reads kube-apiserver's `/metrics` (the admin client may).
pub async fn scrape(client: &Client) -> Result<Scrape> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(request).await.context("GET /metrics")?;
    Ok(parse(&text, &HISTOGRAMS))
}

/// This process's own metrics (the webhook server runs in it).
pub fn scrape_own() -> Scrape {
    parse(&homelab_autoscaler::telemetry::render(None).1, &[own_histogram().as_str()])
}

fn parse(text: &str, histograms: &[&str]) -> Scrape {
    let mut series = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((key, value)) = line.rsplit_once(' ') else { continue };
        let Ok(value) = value.parse::<f64>() else { continue };
        let (name, labels) = key.split_once('{').map_or((key, ""), |(n, l)| (n, l));
        for &histogram in histograms {
            let Some(suffix) = name.strip_prefix(histogram) else { continue };
            let entry: &mut (f64, f64) =
                series.entry(format!("{histogram}{{{labels}")).or_default();
            match suffix {
                "_sum" => entry.0 = value,
                "_count" => entry.1 = value,
                _ => {}
            }
        }
    }
    Scrape(series)
}

/// The value of `key` in `name{k="v",…}`, `""` when absent (as Prometheus reads it).
fn label<'a>(series: &'a str, key: &str) -> &'a str {
    let Some((_, labels)) = series.split_once('{') else { return "" };
    for pair in labels.trim_end_matches('}').split(',') {
        if let Some((k, v)) = pair.split_once('=')
            && k == key
        {
            return v.trim_matches('"');
        }
    }
    ""
}

impl Scrape {
    /// What `row`'s series added since `before`: calls and their mean.
    pub fn since(&self, before: &Scrape, row: &Row) -> (u64, Duration) {
        let (mut sum, mut count) = (0.0, 0.0);
        for (series, (s, c)) in &self.0 {
            let name = series.split_once('{').map_or(series.as_str(), |(n, _)| n);
            if name != row.histogram.as_str()
                || !row.labels.iter().all(|(k, v)| label(series, k) == *v)
            {
                continue;
            }
            let (s0, c0) = before.0.get(series).copied().unwrap_or_default();
            sum += s - s0;
            count += c - c0;
        }
        let mean = if count > 0.0 { Duration::from_secs_f64(sum / count) } else { Duration::ZERO };
        (count.round() as u64, mean)
    }
}

/// The client ports of every TCP connection to `port` on this host that the kernel still
/// lists (established, closing or in TIME-WAIT on either side, which lasts 60 s).
pub fn connections_to(port: u16) -> Result<BTreeSet<u16>> {
    let mut clients = BTreeSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else { continue };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(remote), Some(state)) =
                (fields.get(1), fields.get(2), fields.get(3))
            else {
                continue;
            };
            let port_of = |address: &str| {
                address.rsplit_once(':').and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
            };
            const LISTEN: &str = "0A";
            if *state == LISTEN {
                continue;
            }
            match (port_of(local), port_of(remote)) {
                (Some(l), Some(r)) if l == port => clients.insert(r),
                (Some(l), Some(r)) if r == port => clients.insert(l),
                _ => false,
            };
        }
    }
    Ok(clients)
}
