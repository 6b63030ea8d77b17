//! The process families every Prometheus client library exports under the same names
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, …), read from
//! `/proc/self` at each scrape with the `procfs` crate, so a dashboard or alert written for
//! any exporter reads both netclaim processes too.

use procfs::process::{LimitValue, Process};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// The process as one scrape reads it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessSample {
    /// User plus system CPU time, in seconds.
    pub cpu_seconds: f64,
    /// Resident set size, in bytes.
    pub resident_memory_bytes: u64,
    /// Virtual memory size, in bytes.
    pub virtual_memory_bytes: u64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// The soft `RLIMIT_NOFILE` (`None`: unlimited).
    pub max_fds: Option<u64>,
    /// Start time, in seconds since the Unix epoch.
    pub start_time_seconds: f64,
}

/// Reads [`ProcessSample`] from `/proc/self` (and `/proc/stat`'s boot time: the kernel gives
/// a process's start in clock ticks since boot).
#[allow(
    clippy::cast_precision_loss,
    reason = "clock ticks and seconds since 1970 stay far below 2^52, exact in an f64"
)]
pub fn read() -> procfs::ProcResult<ProcessSample> {
    let process = Process::myself()?;
    let stat = process.stat()?;
    let ticks = procfs::ticks_per_second() as f64;
    let page_size = procfs::page_size();
    let limits = process.limits()?;
    Ok(ProcessSample {
        cpu_seconds: (stat.utime + stat.stime) as f64 / ticks,
        resident_memory_bytes: stat.rss.saturating_mul(page_size),
        virtual_memory_bytes: stat.vsize,
        open_fds: process.fd_count()? as u64,
        max_fds: match limits.max_open_files.soft_limit {
            LimitValue::Value(limit) => Some(limit),
            LimitValue::Unlimited => None,
        },
        start_time_seconds: procfs::boot_time_secs()? as f64 + stat.starttime as f64 / ticks,
    })
}

/// The process families, sampled at each scrape. Register it on a registry without prefix:
/// the names are the conventional ones.
#[derive(Debug, Default)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        // A failed read leaves the families declared without samples: the scrape still
        // succeeds and the families stay known (`/proc` is always there on Linux; this is
        // for a sandbox that hides it).
        let sample = read()
            .inspect_err(|err| tracing::debug!(%err, "reading /proc/self for process metrics"))
            .ok();
        let cpu = encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            MetricType::Counter,
        )?;
        if let Some(sample) = &sample {
            ConstCounter::new(sample.cpu_seconds).encode(cpu)?;
        }
        let counts: [(&str, &str, Option<u64>); 4] = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                sample.map(|s| s.resident_memory_bytes),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                sample.map(|s| s.virtual_memory_bytes),
            ),
            ("process_open_fds", "Number of open file descriptors", sample.map(|s| s.open_fds)),
            (
                "process_max_fds",
                "Maximum number of open file descriptors (soft limit)",
                // Linux refuses an unlimited RLIMIT_NOFILE (it is capped by fs.nr_open), so
                // `None` is only a parse of something else: no sample then.
                sample.and_then(|s| s.max_fds),
            ),
        ];
        for (name, help, value) in counts {
            let family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            if let Some(value) = value {
                ConstGauge::new(value).encode(family)?;
            }
        }
        let family = encoder.encode_descriptor(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds",
            None,
            MetricType::Gauge,
        )?;
        if let Some(sample) = &sample {
            ConstGauge::new(sample.start_time_seconds).encode(family)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_is_this_process() {
        let sample = read().expect("/proc/self is readable in tests");
        let file = std::fs::File::open("/proc/self/stat").expect("open a file");
        let with_one_more = read().expect("/proc/self is readable in tests");
        assert!(with_one_more.open_fds > sample.open_fds, "{sample:?} {with_one_more:?}");
        drop(file);
        assert!(sample.resident_memory_bytes > 0 && sample.virtual_memory_bytes > 0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs_f64();
        assert!(sample.start_time_seconds <= now, "{sample:?} now {now}");
        let limits = std::fs::read_to_string("/proc/self/limits").expect("read the limits");
        let soft = limits
            .lines()
            .find_map(|line| line.strip_prefix("Max open files"))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|soft| soft.parse::<u64>().ok());
        assert_eq!(sample.max_fds, soft, "{limits}");
    }
}
