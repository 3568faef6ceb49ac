//! Appends a run to `docs/benchmarks.md`: a section with the command, the
//! commit, the machine and one table per scenario, plus SVG plots of the
//! latency percentiles by load for `write` and `watch`.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn output(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// `2 CPUs (model), 24 GiB`, read from `/proc`.
fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpus = cpuinfo.lines().filter(|l| l.starts_with("processor")).count();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split(':').nth(1).map(str::trim))
        .unwrap_or("unknown CPU");
    let mem_kib: f64 = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().next()?.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0.0);
    format!("{cpus} CPUs ({model}), {:.0} GiB", mem_kib / 1024.0 / 1024.0)
}

/// `{"a": {"b": 1}}` → `[("a.b", "1")]`, in the object's order.
fn flatten(prefix: &str, value: &Value, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flatten(&key, v, out);
            }
        }
        Value::String(s) => out.push((prefix.to_string(), s.clone())),
        other => out.push((prefix.to_string(), other.to_string())),
    }
}

/// One Markdown table per scenario (rows of that scenario's results).
fn tables(results: &[Value]) -> String {
    let mut md = String::new();
    let mut scenarios: Vec<&str> = Vec::new();
    for r in results {
        let s = r["scenario"].as_str().unwrap_or("?");
        if !scenarios.contains(&s) {
            scenarios.push(s);
        }
    }
    for scenario in scenarios {
        let rows: Vec<Vec<(String, String)>> = results
            .iter()
            .filter(|r| r["scenario"] == scenario)
            .map(|r| {
                let mut flat = Vec::new();
                flatten("", r, &mut flat);
                flat.retain(|(k, _)| k != "scenario");
                flat
            })
            .collect();
        let mut columns: Vec<String> = Vec::new();
        for row in &rows {
            for (k, _) in row {
                if !columns.contains(k) {
                    columns.push(k.clone());
                }
            }
        }
        let _ = writeln!(md, "\n#### {scenario}\n\n| {} |", columns.join(" | "));
        let _ = writeln!(md, "|{}", "---|".repeat(columns.len()));
        for row in rows {
            let cells: Vec<&str> = columns
                .iter()
                .map(|c| row.iter().find(|(k, _)| k == c).map_or("", |(_, v)| v.as_str()))
                .collect();
            let _ = writeln!(md, "| {} |", cells.join(" | "));
        }
    }
    md
}

/// A line chart of p50/p90/p99 (milliseconds, log scale) by load.
pub fn latency_plot(title: &str, points: &[(String, [f64; 3])]) -> String {
    let (w, h, left, bottom, top, right) = (640.0, 360.0, 60.0, 50.0, 40.0, 110.0);
    let plot_w = w - left - right;
    let plot_h = h - top - bottom;
    let all = points.iter().flat_map(|(_, v)| v.iter().copied()).filter(|v| *v > 0.0);
    let (lo, hi) = all.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo, hi) = if lo > hi { (0.1, 10.0) } else { (lo, hi) };
    let (log_lo, log_hi) = (lo.log10().floor(), hi.log10().ceil().max(lo.log10().floor() + 1.0));
    let y = |v: f64| top + plot_h * (1.0 - (v.max(lo).log10() - log_lo) / (log_hi - log_lo));
    let x = |i: usize| {
        left + if points.len() < 2 {
            plot_w / 2.0
        } else {
            plot_w * i as f64 / (points.len() - 1) as f64
        }
    };
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">{title}</text>\n",
        w / 2.0
    );
    let mut decade = log_lo;
    while decade <= log_hi {
        let v = 10f64.powf(decade);
        let _ = writeln!(
            svg,
            "<line x1=\"{left}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{v} ms</text>",
            left + plot_w,
            left - 6.0,
            y(v) + 4.0,
            y = y(v)
        );
        decade += 1.0;
    }
    for (i, (label, _)) in points.iter().enumerate() {
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{label}</text>",
            x(i),
            top + plot_h + 18.0
        );
    }
    for (series, (name, color)) in
        [("p50", "#1f77b4"), ("p90", "#ff7f0e"), ("p99", "#d62728")].iter().enumerate()
    {
        let path: Vec<String> = points
            .iter()
            .enumerate()
            .map(|(i, (_, v))| format!("{:.1},{:.1}", x(i), y(v[series])))
            .collect();
        let _ = writeln!(
            svg,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
            path.join(" ")
        );
        for p in &path {
            let (px, py) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(svg, "<circle cx=\"{px}\" cy=\"{py}\" r=\"3\" fill=\"{color}\"/>");
        }
        let ly = top + 20.0 * series as f64;
        let _ = writeln!(
            svg,
            "<line x1=\"{}\" x2=\"{}\" y1=\"{ly}\" y2=\"{ly}\" stroke=\"{color}\" stroke-width=\"2\"/><text x=\"{}\" y=\"{}\">{name}</text>",
            w - right + 10.0,
            w - right + 30.0,
            w - right + 36.0,
            ly + 4.0
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// Latency points (label, [p50, p90, p99] in ms) of the results of one
/// scenario, labelled by `label`.
fn points(
    results: &[Value],
    scenario: &str,
    latency: &str,
    label: impl Fn(&Value) -> String,
) -> Vec<(String, [f64; 3])> {
    results
        .iter()
        .filter(|r| r["scenario"] == scenario && r[latency].is_object())
        .map(|r| {
            let ms = |q: &str| r[latency][q].as_f64().unwrap_or(0.0) / 1000.0;
            (label(r), [ms("p50_us"), ms("p90_us"), ms("p99_us")])
        })
        .collect()
}

/// Appends a section for `results` to `path`, and writes the plots next
/// to it.
pub fn append(path: &Path, results: &[Value]) -> anyhow::Result<()> {
    let commit = output("git", &["rev-parse", "--short", "HEAD"]);
    let date = output("date", &["-u", "+%Y-%m-%d"]);
    let command: Vec<String> = std::env::args()
        .enumerate()
        .map(|(i, a)| if i == 0 { "gantry-bench".into() } else { a })
        .collect();
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut md = format!(
        "\n## Run of {date}, commit `{commit}`\n\nCommand: `{}`. Machine: {}.\n",
        command.join(" "),
        machine()
    );
    let plots = [
        (
            "write",
            "latency",
            "write: acknowledged UpdateGateway latency by clients",
            points(results, "write", "latency", |r| {
                format!("{} {}", r["clients"], r["backend"].as_str().unwrap_or(""))
            }),
        ),
        (
            "watch",
            "write_to_receive",
            "watch: write → receive latency by watchers/connections",
            points(results, "watch", "write_to_receive", |r| {
                format!("{}/{}", r["watchers"], r["connections"])
            }),
        ),
    ];
    for (name, _, title, points) in plots {
        if points.is_empty() {
            continue;
        }
        // A run of the same commit on the same day keeps its own plot.
        let file = (1..)
            .map(|n| match n {
                1 => format!("benchmarks-{date}-{commit}-{name}.svg"),
                n => format!("benchmarks-{date}-{commit}-{name}-{n}.svg"),
            })
            .find(|f| !dir.join(f).exists())
            .unwrap_or_default();
        std::fs::write(dir.join(&file), latency_plot(title, &points))?;
        let _ = writeln!(md, "\n![{title}]({file})");
    }
    md.push_str(&tables(results));
    let mut f = std::fs::OpenOptions::new().append(true).create(true).open(path)?;
    f.write_all(md.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tables_flatten_nested_results_into_columns() {
        let md = tables(&[
            json!({"scenario": "write", "clients": 1, "latency": {"p50_us": 900}}),
            json!({"scenario": "write", "clients": 16, "latency": {"p50_us": 2500}}),
        ]);
        assert!(md.contains("| clients | latency.p50_us |"), "{md}");
        assert!(md.contains("| 16 | 2500 |"), "{md}");
    }

    #[test]
    fn plot_has_one_line_per_percentile_and_a_label_per_load() {
        let svg =
            latency_plot("t", &[("1".into(), [1.0, 2.0, 3.0]), ("16".into(), [2.0, 8.0, 20.0])]);
        assert_eq!(svg.matches("<polyline").count(), 3);
        assert!(svg.contains(">16</text>") && svg.contains(">10 ms</text>"), "{svg}");
    }
}
