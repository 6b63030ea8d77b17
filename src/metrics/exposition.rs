//! The two exposition formats `/metrics` speaks and the choice between them: OpenMetrics 1.0
//! (what `prometheus-client` encodes) when the scraper's `Accept` asks for it, else the
//! Prometheus text format 0.0.4, each body in the format its `Content-Type` names.
//!
//! Why both: the formats name counters differently. OpenMetrics declares the family without
//! its suffix (`# TYPE x counter`, sample `x_total`) and ends with `# EOF`; the text format
//! declares the sample's own name (`# TYPE x_total counter`). Prometheus parses a body with
//! the parser of the content type it was served with, so an OpenMetrics body labelled 0.0.4
//! leaves every counter untyped. Prometheus asks for OpenMetrics first (its default
//! `scrape_protocols`); `curl`, older scrapers and other agents ask for `*/*` or
//! `text/plain` and get the text format.
//!
//! `prometheus-client` has no 0.0.4 encoder (its other one is the OpenMetrics protobuf, which
//! Prometheus does not negotiate), so [`openmetrics_to_text`] rewrites its OpenMetrics
//! output: a mechanical translation of the descriptors that differ, sample lines unchanged.

use prometheus_client::registry::Registry;

/// The content type of the text format 0.0.4.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The content type of OpenMetrics 1.0.0.
pub const OPENMETRICS_1_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of OpenMetrics 0.0.1, the draft's version string (Prometheus still offers
/// it, after 1.0.0; the body is the same).
pub const OPENMETRICS_0_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=0.0.1; charset=utf-8";

/// A body format `/metrics` serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format 0.0.4.
    Text,
    /// OpenMetrics text, announced as version 1.0.0.
    OpenMetrics1,
    /// OpenMetrics text, announced as version 0.0.1.
    OpenMetrics0,
}

impl Format {
    /// The `Content-Type` of a body in this format.
    #[must_use]
    pub const fn content_type(self) -> &'static str {
        match self {
            Self::Text => TEXT_CONTENT_TYPE,
            Self::OpenMetrics1 => OPENMETRICS_1_CONTENT_TYPE,
            Self::OpenMetrics0 => OPENMETRICS_0_CONTENT_TYPE,
        }
    }
}

/// The format to answer a request whose `Accept` header is `accept`: the acceptable format
/// of the highest quality, the earlier one on a tie (RFC 9110 §12.5.1; a scraper lists its
/// preference first). No header, nothing we serve, or only wildcards: the text format, as
/// Prometheus' own Go client answers (a 406 would only leave such a scraper without data).
#[must_use]
pub fn negotiate(accept: Option<&str>) -> Format {
    let mut best: Option<(f32, Format)> = None;
    for range in accept.unwrap_or_default().split(',') {
        let mut parts = range.split(';');
        let media = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
        let mut version = None;
        let mut quality = Some(1.0_f32);
        for parameter in parts {
            let Some((key, value)) = parameter.split_once('=') else { continue };
            let value = value.trim().trim_matches('"');
            match key.trim().to_ascii_lowercase().as_str() {
                "version" => version = Some(value.to_owned()),
                // An unreadable weight makes the range unusable rather than preferred.
                "q" => quality = value.parse::<f32>().ok().filter(|q| (0.0..=1.0).contains(q)),
                _ => {}
            }
        }
        let Some(quality) = quality.filter(|q| *q > 0.0) else { continue };
        let format = match (media.as_str(), version.as_deref()) {
            ("application/openmetrics-text", None | Some("1.0.0")) | ("application/*", _) => {
                Format::OpenMetrics1
            }
            ("application/openmetrics-text", Some("0.0.1")) => Format::OpenMetrics0,
            ("text/plain", None | Some("0.0.4")) | ("text/*" | "*/*", _) => Format::Text,
            // Other versions (the text format 1.0.0 with UTF-8 names, …), protobuf: not served.
            _ => continue,
        };
        if best.is_none_or(|(q, _)| quality > q) {
            best = Some((quality, format));
        }
    }
    best.map_or(Format::Text, |(_, format)| format)
}

/// `registry` encoded in `format`.
#[must_use]
pub fn encode_as(registry: &Registry, format: Format) -> String {
    let openmetrics = encode_openmetrics(registry);
    match format {
        Format::Text => openmetrics_to_text(&openmetrics),
        Format::OpenMetrics1 | Format::OpenMetrics0 => openmetrics,
    }
}

/// `registry` in OpenMetrics text, `# EOF` included.
#[must_use]
pub fn encode_openmetrics(registry: &Registry) -> String {
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _infallible = prometheus_client::encoding::text::encode(&mut text, registry);
    text
}

/// The family being translated: its OpenMetrics name and type.
struct Family<'a> {
    name: &'a str,
    kind: &'a str,
}

/// The OpenMetrics text `prometheus-client` encodes, in the text format 0.0.4:
/// - a counter's `# HELP`/`# TYPE` name the sample's name, `x_total`;
/// - an info family `x` becomes the gauge `x_info` (0.0.4 has no info type, its sample is
///   `x_info … 1` in both), `unknown` becomes `untyped`;
/// - `# UNIT`, `# EOF`, `_created` samples (0.0.4 would read them as separate series) and
///   exemplars go.
///
/// Sample lines are otherwise the same in both formats (label escaping, `+Inf`, `NaN`); the
/// crate writes no sample timestamps, whose units would differ (seconds, milliseconds).
#[must_use]
pub fn openmetrics_to_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut help: Option<(&str, &str)> = None;
    let mut family: Option<Family<'_>> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = Some(rest.split_once(' ').unwrap_or((rest, "")));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            let (text_name, text_kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                "unknown" => (name.to_owned(), "untyped"),
                other => (name.to_owned(), other),
            };
            if let Some((help_name, text)) = help.take()
                && help_name == name
            {
                push_line(&mut out, &format!("# HELP {text_name} {text}"));
            }
            push_line(&mut out, &format!("# TYPE {text_name} {text_kind}"));
            family = Some(Family { name, kind });
            continue;
        }
        if line.starts_with('#') {
            // `# UNIT`, `# EOF`: OpenMetrics only.
            continue;
        }
        let sample = without_exemplar(line);
        let created = family.as_ref().is_some_and(|f| {
            matches!(f.kind, "counter" | "histogram" | "summary" | "gaugehistogram")
                && sample_name(sample) == format!("{}_created", f.name)
        });
        if !created && !sample.is_empty() {
            push_line(&mut out, sample);
        }
    }
    out
}

fn push_line(out: &mut String, line: &str) {
    out.push_str(line);
    out.push('\n');
}

/// The metric name of a sample line.
fn sample_name(sample: &str) -> &str {
    let end = sample.find(['{', ' ']).unwrap_or(sample.len());
    &sample[..end]
}

/// `sample` without its exemplar (` # {labels} value [timestamp]` after the value). The
/// search starts after the label set, whose quoted values may hold ` # `.
fn without_exemplar(sample: &str) -> &str {
    let after_labels = label_set_end(sample);
    match sample[after_labels..].find(" # ") {
        Some(at) => sample[..after_labels + at].trim_end(),
        None => sample,
    }
}

/// The byte offset just past the sample's label set (`{…}`), or of its name when it has none.
fn label_set_end(sample: &str) -> usize {
    let Some(open) = sample.find('{').filter(|open| !sample[..*open].contains(' ')) else {
        return sample.find(' ').unwrap_or(sample.len());
    };
    let mut quoted = false;
    let mut escaped = false;
    for (offset, c) in sample[open..].char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return open + offset + 1,
            _ => {}
        }
    }
    sample.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What Prometheus 2.x/3.x sends with its default `scrape_protocols`.
    const PROMETHEUS_2: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    const PROMETHEUS_3: &str = "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1";

    #[test]
    fn accept_headers_choose_the_format_of_highest_quality() {
        for (accept, expected) in [
            (Some(PROMETHEUS_2), Format::OpenMetrics1),
            (Some(PROMETHEUS_3), Format::OpenMetrics1),
            (None, Format::Text),
            (Some(""), Format::Text),
            (Some("*/*"), Format::Text),
            (Some("text/plain"), Format::Text),
            (Some("text/plain;version=0.0.4"), Format::Text),
            (Some("application/openmetrics-text"), Format::OpenMetrics1),
            (Some("application/openmetrics-text; version=0.0.1"), Format::OpenMetrics0),
            (Some("Application/OpenMetrics-Text; Version=\"1.0.0\""), Format::OpenMetrics1),
            // A scraper that prefers the text format, or refuses OpenMetrics.
            (Some("application/openmetrics-text;q=0.2,text/plain;q=0.9"), Format::Text),
            (Some("application/openmetrics-text;q=0,*/*"), Format::Text),
            (
                Some("text/plain;version=0.0.4;q=0.5,application/openmetrics-text"),
                Format::OpenMetrics1,
            ),
            // Versions and encodings we do not serve: the next choice, or the default.
            (Some("application/openmetrics-text;version=2.0.0,text/plain;q=0.1"), Format::Text),
            (
                Some("text/plain;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.5"),
                Format::OpenMetrics0,
            ),
            (
                Some(
                    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited",
                ),
                Format::Text,
            ),
            (Some("application/openmetrics-text;q=nonsense"), Format::Text),
            // A tie goes to the earlier range.
            (Some("text/plain,application/openmetrics-text"), Format::Text),
        ] {
            assert_eq!(negotiate(accept), expected, "Accept: {accept:?}");
        }
    }

    #[test]
    fn each_format_has_its_content_type() {
        assert_eq!(Format::Text.content_type(), "text/plain; version=0.0.4; charset=utf-8");
        assert_eq!(
            Format::OpenMetrics1.content_type(),
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
        assert_eq!(
            Format::OpenMetrics0.content_type(),
            "application/openmetrics-text; version=0.0.1; charset=utf-8"
        );
    }

    #[test]
    fn the_text_format_names_counters_by_their_samples_and_has_no_eof() {
        let openmetrics = concat!(
            "# HELP x_requests Requests.\n",
            "# TYPE x_requests counter\n",
            "x_requests_total{result=\"ok # not an exemplar\"} 3 # {trace=\"a\"} 1.0\n",
            "x_requests_created{result=\"ok # not an exemplar\"} 1700000000.0\n",
            "# HELP x_build Build.\n",
            "# TYPE x_build info\n",
            "x_build_info{version=\"1.2.3\"} 1\n",
            "# HELP x_latency_seconds Latency.\n",
            "# TYPE x_latency_seconds histogram\n",
            "# UNIT x_latency_seconds seconds\n",
            "x_latency_seconds_sum 0.5\n",
            "x_latency_seconds_count 1\n",
            "x_latency_seconds_bucket{le=\"+Inf\"} 1\n",
            "# HELP x_mystery Unknown.\n",
            "# TYPE x_mystery unknown\n",
            "x_mystery 7\n",
            "# HELP x_up Up.\n",
            "# TYPE x_up gauge\n",
            "# EOF\n",
        );
        assert_eq!(
            openmetrics_to_text(openmetrics),
            concat!(
                "# HELP x_requests_total Requests.\n",
                "# TYPE x_requests_total counter\n",
                "x_requests_total{result=\"ok # not an exemplar\"} 3\n",
                "# HELP x_build_info Build.\n",
                "# TYPE x_build_info gauge\n",
                "x_build_info{version=\"1.2.3\"} 1\n",
                "# HELP x_latency_seconds Latency.\n",
                "# TYPE x_latency_seconds histogram\n",
                "x_latency_seconds_sum 0.5\n",
                "x_latency_seconds_count 1\n",
                "x_latency_seconds_bucket{le=\"+Inf\"} 1\n",
                "# HELP x_mystery Unknown.\n",
                "# TYPE x_mystery untyped\n",
                "x_mystery 7\n",
                "# HELP x_up Up.\n",
                "# TYPE x_up gauge\n",
            )
        );
    }
}
