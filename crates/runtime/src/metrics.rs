//! What every gantry service exports besides its own metrics (the
//! process's resources, as Prometheus client libraries name them, and
//! `gantry_build_info`), and the two text formats `/metrics` speaks:
//! OpenMetrics for a scraper that asks for it, the classic Prometheus text
//! format (0.0.4) otherwise.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

/// Content type of the OpenMetrics text exposition.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Content type of the classic Prometheus text exposition.
pub const CLASSIC_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    service: String,
    version: String,
}

/// The metrics every service shares: `process_*` and `gantry_build_info`.
#[derive(Debug)]
pub struct Common {
    registry: Registry,
}

impl Common {
    /// For the service `service` (its binary's name) at `version`.
    pub fn new(service: &str, version: &str) -> Common {
        let mut registry = Registry::default();
        let build = Family::<BuildLabels, Gauge>::default();
        build
            .get_or_create(&BuildLabels { service: service.into(), version: version.into() })
            .set(1);
        registry.register(
            "gantry_build_info",
            "Always 1; the labels say which service and version this process runs",
            build,
        );
        registry.register_collector(Box::new(Process));
        Common { registry }
    }

    /// The OpenMetrics text of `own` followed by these, ending `# EOF`.
    pub fn encode(&self, own: &Registry) -> String {
        use prometheus_client::encoding::text;
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = text::encode_registry(&mut out, own)
            .and_then(|()| text::encode_registry(&mut out, &self.registry))
            .and_then(|()| text::encode_eof(&mut out));
        out
    }
}

/// Whether a scrape's `Accept` header asks for OpenMetrics (Prometheus
/// lists it first when it can read it); anything else gets the classic
/// format, which every scraper and `promtool check metrics` reads.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("application/openmetrics-text"))
}

/// The classic text format (0.0.4) of an OpenMetrics exposition: a
/// counter's HELP and TYPE name its `_total` sample, and the lines
/// OpenMetrics adds (`# UNIT`, `# EOF`) are left out.
pub fn classic_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .filter(|(_, kind)| *kind == "counter")
        .map(|(name, _)| name)
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta =
            ["# HELP ", "# TYPE "].into_iter().find_map(|p| Some((p, line.strip_prefix(p)?)));
        match meta {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let suffix = if counters.contains(name) { "_total" } else { "" };
                // HELP escapes only backslash and newline in 0.0.4.
                let tail =
                    if prefix == "# HELP " { tail.replace("\\\"", "\"") } else { tail.into() };
                out.push_str(&format!("{prefix}{name}{suffix} {tail}\n"));
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// The process collector: CPU time, memory, file descriptors and start
/// time, read from `/proc` on each scrape (Linux; nothing elsewhere).
#[derive(Debug)]
struct Process;

/// Clock ticks per second of `/proc/<pid>/stat` (USER_HZ, 100 on Linux).
const USER_HZ: f64 = 100.0;

impl Collector for Process {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(p) = ProcessStats::read() else { return Ok(()) };
        let cpu = ConstCounter::new(p.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            cpu.metric_type(),
        )?)?;
        let gauges: [(&str, &str, f64); 5] = [
            ("process_resident_memory_bytes", "Resident memory size in bytes.", p.resident_bytes),
            ("process_virtual_memory_bytes", "Virtual memory size in bytes.", p.virtual_bytes),
            ("process_open_fds", "Number of open file descriptors.", p.open_fds),
            ("process_max_fds", "Maximum number of open file descriptors.", p.max_fds),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                p.start_time_seconds,
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

/// What the process collector reads.
#[derive(Debug, Default, PartialEq)]
struct ProcessStats {
    cpu_seconds: f64,
    resident_bytes: f64,
    virtual_bytes: f64,
    open_fds: f64,
    max_fds: f64,
    start_time_seconds: f64,
}

impl ProcessStats {
    fn read() -> Option<ProcessStats> {
        let proc = |path: &str| std::fs::read_to_string(format!("/proc/{path}")).ok();
        let mut stats = ProcessStats::parse(
            &proc("self/stat")?,
            &proc("self/status")?,
            &proc("self/limits")?,
            &proc("stat")?,
        )?;
        stats.open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as f64;
        Some(stats)
    }

    /// From `/proc/self/stat`, `/proc/self/status`, `/proc/self/limits` and
    /// `/proc/stat` (for the boot time); open fds are counted apart.
    fn parse(stat: &str, status: &str, limits: &str, system: &str) -> Option<ProcessStats> {
        // Fields after the command name (which may hold spaces and ')'):
        // [0] is field 3 (state), so field N is [N - 3].
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<f64>().ok();
        let kib = |key: &str| {
            let line = status.lines().find(|l| l.starts_with(key))?;
            Some(line.split_whitespace().nth(1)?.parse::<f64>().ok()? * 1024.0)
        };
        let max_fds = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))?
            .split_whitespace()
            .nth(3)?
            .parse()
            .ok()?;
        let boot: f64 =
            system.lines().find_map(|l| l.strip_prefix("btime "))?.trim().parse().ok()?;
        Some(ProcessStats {
            cpu_seconds: (field(14)? + field(15)?) / USER_HZ,
            resident_bytes: kib("VmRSS:")?,
            virtual_bytes: kib("VmSize:")?,
            open_fds: 0.0,
            max_fds,
            start_time_seconds: boot + field(22)? / USER_HZ,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_give_the_process_metrics() {
        let stat = "4242 (gate way) x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 9 0 12345 2000000 500 18446744073709551615";
        let status = "Name:\tgateway-store\nVmSize:\t  204800 kB\nVmRSS:\t   10240 kB\n";
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 524288               files\n";
        let system = "cpu  1 2 3\nbtime 1764900000\n";
        let stats = ProcessStats::parse(stat, status, limits, system).unwrap();
        assert_eq!(
            stats,
            ProcessStats {
                cpu_seconds: 3.0,
                resident_bytes: 10_485_760.0,
                virtual_bytes: 209_715_200.0,
                open_fds: 0.0,
                max_fds: 1024.0,
                start_time_seconds: 1_764_900_123.45,
            }
        );
        assert!(ProcessStats::read().is_some_and(|s| s.open_fds > 0.0 && s.resident_bytes > 0.0));
    }

    #[test]
    fn the_classic_format_names_counters_by_their_samples() {
        let mut own = Registry::with_prefix("gantry_test");
        let calls = prometheus_client::metrics::counter::Counter::<u64>::default();
        calls.inc();
        own.register("calls", "Calls \"made\"", calls);
        let text = Common::new("gantry-test", "1.2.3").encode(&own);
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(text.contains("# TYPE gantry_test_calls counter\ngantry_test_calls_total 1\n"));
        assert!(text.contains("gantry_build_info{service=\"gantry-test\",version=\"1.2.3\"} 1"));
        assert!(text.contains("process_cpu_seconds_total "), "{text}");
        let classic = classic_text(&text);
        assert!(
            classic.contains("# HELP gantry_test_calls_total Calls \"made\".\n# TYPE gantry_test_calls_total counter\ngantry_test_calls_total 1\n"),
            "{classic}"
        );
        assert!(classic.contains("# TYPE process_cpu_seconds_total counter\n"), "{classic}");
        assert!(!classic.contains("# EOF") && !classic.contains("# UNIT"), "{classic}");
        assert!(wants_openmetrics(Some(
            "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3"
        )));
        assert!(!wants_openmetrics(Some("text/plain")) && !wants_openmetrics(None));
    }
}
