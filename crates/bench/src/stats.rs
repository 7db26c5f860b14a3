//! Percentiles and the report table.

use std::fmt::Write as _;

/// One line of the report.
#[derive(Debug, Clone)]
pub struct Row {
    /// Workload name.
    pub workload: String,
    /// What was measured (cellhost or a peer).
    pub system: String,
    /// Samples.
    pub n: usize,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Unit of p50/p99.
    pub unit: &'static str,
    /// Peer p50 / cellhost p50 (above 1: cellhost is better), when a
    /// comparison exists.
    pub ratio: Option<f64>,
    /// Extra figure (RSS, throughput, survivors…).
    pub note: String,
}

/// Nearest-rank percentile of `v` (NaN for no samples).
pub fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let idx = ((p / 100.0) * (s.len() - 1) as f64).round() as usize;
    s[idx.min(s.len() - 1)]
}

/// A row from samples in milliseconds.
pub fn row(workload: &str, system: &str, v: &[f64]) -> Row {
    Row {
        workload: workload.into(),
        system: system.into(),
        n: v.len(),
        p50: percentile(v, 50.0),
        p99: percentile(v, 99.0),
        unit: "ms",
        ratio: None,
        note: String::new(),
    }
}

/// The markdown table.
pub fn render(rows: &[Row]) -> String {
    let mut s = String::from(
        "| workload | system | n | p50 | p99 | ratio | note |\n| --- | --- | ---: | ---: | ---: | ---: | --- |\n",
    );
    for r in rows {
        let ratio = r.ratio.map(|x| format!("{x:.1}×")).unwrap_or_else(|| "—".into());
        let fmt = |x: f64| {
            if x.is_nan() {
                "—".to_string()
            } else {
                format!("{x:.2} {}", r.unit)
            }
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.workload,
            r.system,
            r.n,
            fmt(r.p50),
            fmt(r.p99),
            ratio,
            r.note
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_sorted_ranks() {
        let v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 51.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert!(percentile(&[], 50.0).is_nan());
    }

    #[test]
    fn table_has_one_line_per_row() {
        let mut r = row("W1", "cellhost", &[1.0, 2.0]);
        r.ratio = Some(3.0);
        let t = render(&[r]);
        assert_eq!(t.lines().count(), 3);
        assert!(t.contains("| W1 | cellhost | 2 |") && t.contains("3.0×"));
    }
}
