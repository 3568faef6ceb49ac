//! The spread of repeated side-by-side runs (`versus --runs N`): one run's
//! ratio to etcd moves by up to 2.5× on this machine (docs/benchmarks.md),
//! so a verdict is read from the median of several runs, with the lowest
//! and highest beside it.

use serde_json::{json, Value};

/// The `versus` rows' figures that get a median, lowest and highest.
const FIGURES: [&str; 5] =
    ["ratio", "gantry_p50_ms", "etcd_p50_ms", "gantry_p99_ms", "etcd_p99_ms"];

/// One `versus_spread` row per case and load (in the order first seen)
/// that appears in more than one run: each figure's median, lowest and
/// highest, and in how many runs gantry's p99 was at or under etcd's.
pub(crate) fn summary(rows: &[Value]) -> Vec<Value> {
    let mut keys: Vec<(&Value, &Value, &Value)> = Vec::new();
    let versus = rows.iter().filter(|r| r["scenario"] == "versus");
    for r in versus.clone() {
        let key = (&r["case"], &r["load"], &r["backend"]);
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    let mut out = Vec::new();
    for (case, load, backend) in keys {
        let runs: Vec<&Value> = versus
            .clone()
            .filter(|r| (&r["case"], &r["load"], &r["backend"]) == (case, load, backend))
            .collect();
        if runs.len() < 2 {
            continue;
        }
        let mut row = json!({
            "scenario": "versus_spread", "case": case, "load": load, "backend": backend,
            "runs": runs.len(),
        });
        for figure in FIGURES {
            let values: Vec<f64> = runs.iter().filter_map(|r| r[figure].as_f64()).collect();
            if let Some(spread) = Spread::of(values) {
                row[figure] = spread.json();
            }
        }
        let p99_met = runs
            .iter()
            .filter(|r| match (r["gantry_p99_ms"].as_f64(), r["etcd_p99_ms"].as_f64()) {
                (Some(g), Some(e)) => g <= e,
                _ => false,
            })
            .count();
        row["p99_at_or_under_etcd_runs"] = json!(p99_met);
        out.push(row);
    }
    out
}

/// The median, lowest and highest of some figures.
#[derive(Debug, PartialEq)]
struct Spread {
    median: f64,
    low: f64,
    high: f64,
}

impl Spread {
    /// None when there are no values. The median of an even count is the
    /// mean of the middle two.
    fn of(mut values: Vec<f64>) -> Option<Spread> {
        values.retain(|v| v.is_finite());
        values.sort_by(f64::total_cmp);
        let (low, high) = (*values.first()?, *values.last()?);
        let mid = values.len() / 2;
        let median =
            if values.len() % 2 == 1 { values[mid] } else { (values[mid - 1] + values[mid]) / 2.0 };
        Some(Spread { median, low, high })
    }

    fn json(&self) -> Value {
        let round = |v: f64| (v * 100.0).round() / 100.0;
        json!({"median": round(self.median), "low": round(self.low), "high": round(self.high)})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(case: &str, load: Value, ratio: f64, p99: (f64, f64)) -> Value {
        json!({
            "scenario": "versus", "case": case, "load": load, "backend": "sqlite",
            "ratio": ratio, "gantry_p50_ms": 1.0, "etcd_p50_ms": 2.0,
            "gantry_p99_ms": p99.0, "etcd_p99_ms": p99.1,
        })
    }

    #[test]
    fn the_median_of_an_odd_count_is_the_middle_value_and_of_an_even_count_the_mean_of_two() {
        let odd = Spread::of(vec![3.0, 1.0, 2.0]).unwrap();
        assert_eq!(odd, Spread { median: 2.0, low: 1.0, high: 3.0 });
        let even = Spread::of(vec![4.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!(even, Spread { median: 2.5, low: 1.0, high: 4.0 });
        assert_eq!(Spread::of(vec![f64::NAN]), None);
        assert_eq!(Spread::of(Vec::new()), None);
    }

    #[test]
    fn each_case_and_load_gets_its_spread_over_the_runs_and_single_runs_get_none() {
        let rows = [
            row("write", json!(16), 1.2, (3.0, 4.0)),
            row("write", json!(64), 1.0, (3.0, 4.0)),
            json!({"scenario": "write", "clients": 16}),
            row("write", json!(16), 1.8, (5.0, 4.0)),
            row("watch", json!("1000/10 shared"), 0.8, (1.0, 1.0)),
            row("write", json!(16), 1.5, (4.0, 4.0)),
            row("watch", json!("1000/10 shared"), 1.9, (2.0, 1.0)),
        ];
        let summary = summary(&rows);
        assert_eq!(summary.len(), 2, "{summary:?}");
        let write = &summary[0];
        assert_eq!((write["case"].as_str(), write["load"].as_i64()), (Some("write"), Some(16)));
        assert_eq!(write["runs"], 3);
        assert_eq!(write["ratio"], json!({"median": 1.5, "low": 1.2, "high": 1.8}));
        assert_eq!(write["gantry_p99_ms"], json!({"median": 4.0, "low": 3.0, "high": 5.0}));
        assert_eq!(write["p99_at_or_under_etcd_runs"], 2);
        let watch = &summary[1];
        assert_eq!(watch["load"], "1000/10 shared");
        assert_eq!(watch["ratio"], json!({"median": 1.35, "low": 0.8, "high": 1.9}));
        assert_eq!(watch["p99_at_or_under_etcd_runs"], 1);
    }
}
