//! The operator's own Prometheus figures, scraped from its `/metrics` endpoint.

use std::net::SocketAddr;

use anyhow::Context as _;
use prometheus_parse::{HistogramCount, Scrape, Value};

use super::operator::http_get;

pub struct Metrics(Scrape);

/// Scrapes `http://<addr>/metrics` once.
pub async fn scrape(addr: SocketAddr) -> anyhow::Result<Metrics> {
    let body = http_get(addr, "/metrics")
        .await
        .with_context(|| format!("no answer from http://{addr}/metrics"))?;
    let lines = body.lines().map(|l| Ok(l.to_string()));
    let scrape = Scrape::parse(lines).context("parsing the operator's /metrics")?;
    Ok(Metrics(scrape))
}

impl Metrics {
    /// The sum of a counter or gauge over all series whose `label` has `value`.
    pub fn sum(&self, name: &str, label: &str, value: &str) -> f64 {
        self.0
            .samples
            .iter()
            .filter(|s| s.metric == name && s.labels.get(label) == Some(value))
            .map(|s| match s.value {
                Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
                _ => 0.0,
            })
            // Not `sum()`: a float sum of no series is -0.0, printed "-0.00".
            .fold(0.0, |a, v| a + v)
    }

    /// The sum of a counter or gauge over all its series, whatever their labels.
    pub fn total(&self, name: &str) -> f64 {
        self.0
            .samples
            .iter()
            .filter(|s| s.metric == name)
            .map(|s| match s.value {
                Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
                _ => 0.0,
            })
            // Not `sum()`: a float sum of no series is -0.0, printed "-0.00".
            .fold(0.0, |a, v| a + v)
    }

    /// A histogram's cumulative buckets summed over all series whose `label` has `value`,
    /// ordered by upper bound (the last one is `+Inf`).
    pub fn histogram(&self, name: &str, label: &str, value: &str) -> Vec<HistogramCount> {
        let mut merged: Vec<HistogramCount> = Vec::new();
        let series = self
            .0
            .samples
            .iter()
            .filter(|s| s.metric == name && s.labels.get(label) == Some(value));
        for s in series {
            let Value::Histogram(buckets) = &s.value else {
                continue;
            };
            for b in buckets {
                match merged.iter_mut().find(|m| m.less_than == b.less_than) {
                    Some(m) => m.count += b.count,
                    None => merged.push(b.clone()),
                }
            }
        }
        merged.sort_by(|a, b| a.less_than.total_cmp(&b.less_than));
        merged
    }
}

/// The observations `later` holds beyond `earlier` (two scrapes of one histogram): the
/// histogram of what happened in between.
pub fn since(later: &[HistogramCount], earlier: &[HistogramCount]) -> Vec<HistogramCount> {
    later
        .iter()
        .map(|b| {
            let before = earlier
                .iter()
                .find(|e| e.less_than == b.less_than)
                .map_or(0.0, |e| e.count);
            HistogramCount {
                less_than: b.less_than,
                count: b.count - before,
            }
        })
        .collect()
}

/// The `q`-quantile of cumulative `buckets`, interpolated linearly inside the bucket it falls in
/// (what PromQL's `histogram_quantile` does). `None` without observations. A quantile in the
/// `+Inf` bucket is reported as the highest finite bound: the histogram cannot say more.
pub fn quantile(buckets: &[HistogramCount], q: f64) -> Option<f64> {
    let total = buckets.last()?.count;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for b in buckets {
        if b.count >= rank {
            if b.less_than.is_infinite() {
                return Some(lower);
            }
            let in_bucket = b.count - below;
            let fraction = if in_bucket > 0.0 {
                (rank - below) / in_bucket
            } else {
                1.0
            };
            return Some(lower + (b.less_than - lower) * fraction);
        }
        lower = b.less_than;
        below = b.count;
    }
    Some(lower)
}
