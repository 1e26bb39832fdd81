//! The `/metrics` body, in the format the scraper asks for. prometheus-client writes
//! OpenMetrics; a scraper that does not ask for it (curl, `promtool check metrics`, an older
//! Prometheus) gets the Prometheus text format 0.0.4, which differs in three ways: no `# EOF`,
//! no `# UNIT`, and a counter's HELP and TYPE name the sample with its `_total` suffix.

/// The OpenMetrics content type.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The Prometheus text format content type.
pub const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Every metric of the process, as `(content type, body)`, in OpenMetrics when `accept` names
/// it, else in the Prometheus text format.
pub fn render(accept: Option<&str>) -> (&'static str, String) {
    let mut openmetrics = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut openmetrics, super::registry());
    if accept.is_some_and(|a| a.contains("application/openmetrics-text")) {
        (OPENMETRICS, openmetrics)
    } else {
        (TEXT, to_text_format(&openmetrics))
    }
}

/// Rewrites OpenMetrics text (as prometheus-client writes it) into the Prometheus text format.
pub fn to_text_format(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters.contains(name).then(|| format!("{prefix}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_becomes_the_text_format() {
        let openmetrics = "\
# HELP x_claims Live claims.
# TYPE x_claims gauge
x_claims{phase=\"ready\"} 1
# HELP x_moves Moves.
# TYPE x_moves counter
x_moves_total 3
# HELP x_took_seconds Took.
# TYPE x_took_seconds histogram
# UNIT x_took_seconds seconds
x_took_seconds_sum 1.0
# EOF
";
        let want = "\
# HELP x_claims Live claims.
# TYPE x_claims gauge
x_claims{phase=\"ready\"} 1
# HELP x_moves_total Moves.
# TYPE x_moves_total counter
x_moves_total 3
# HELP x_took_seconds Took.
# TYPE x_took_seconds histogram
x_took_seconds_sum 1.0
";
        assert_eq!(to_text_format(openmetrics), want);
    }

    #[test]
    fn the_scraper_chooses_the_format() {
        assert_eq!(render(Some("application/openmetrics-text;version=1.0.0")).0, OPENMETRICS);
        assert_eq!(render(Some("*/*")).0, TEXT);
        assert_eq!(render(None).0, TEXT);
        assert!(render(Some("application/openmetrics-text")).1.ends_with("# EOF\n"));
    }
}
