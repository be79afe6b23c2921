//! What `/proc` says about a process: resident memory (`VmRSS` in `/proc/<pid>/status`) and CPU
//! time (`utime` + `stime` in `/proc/<pid>/stat`). The chaos suite and the soak sample the
//! service's RSS against its cache budgets, and the harness's own CPU to say how much of the
//! 2-core machine the generator took from the service.

use std::time::Instant;

/// Clock ticks per second of `/proc/<pid>/stat` times (`getconf CLK_TCK`; 100 on Linux).
pub fn clock_ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|output| String::from_utf8(output.stdout).ok())
        .and_then(|text| text.trim().parse::<f64>().ok())
        .filter(|ticks| *ticks > 0.0)
        .unwrap_or(100.0)
}

/// `VmRSS` of `pid` in bytes, `None` when the process is gone.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_vm_rss(&status)
}

/// The `VmRSS:   1234 kB` line of a `/proc/<pid>/status` text, in bytes.
pub fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `utime + stime` in clock ticks from a `/proc/<pid>/stat` line. The command name (field 2)
/// may hold spaces and parentheses, so fields are counted after its closing `)`.
pub fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // After the name: state is field 3, utime field 14, stime field 15 (1-based over the line).
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// CPU ticks used so far by `pid` (`None`: this process).
pub fn cpu_ticks(pid: Option<u32>) -> Option<u64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".to_owned(),
    };
    parse_cpu_ticks(&std::fs::read_to_string(path).ok()?)
}

/// CPU used by a process between two readings, as a share of one core and of the machine.
#[derive(Debug, Clone, Copy)]
pub struct CpuMeter {
    pid: Option<u32>,
    ticks: u64,
    at: Instant,
    ticks_per_second: f64,
}

/// What a [`CpuMeter`] measured.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct CpuShare {
    pub cpu_seconds: f64,
    pub wall_seconds: f64,
    /// CPU seconds ÷ wall seconds (1.0 = one core busy).
    pub cores: f64,
    /// `cores` ÷ the machine's cores.
    pub machine_share: f64,
}

impl CpuMeter {
    pub fn start(pid: Option<u32>, ticks_per_second: f64) -> Self {
        Self {
            pid,
            ticks: cpu_ticks(pid).unwrap_or(0),
            at: Instant::now(),
            ticks_per_second,
        }
    }

    /// CPU since [`CpuMeter::start`]; `None` when the process is gone.
    pub fn read(&self) -> Option<CpuShare> {
        let ticks = cpu_ticks(self.pid)?;
        let cpu_seconds = ticks.saturating_sub(self.ticks) as f64 / self.ticks_per_second;
        let wall_seconds = self.at.elapsed().as_secs_f64().max(1e-9);
        let cores = cpu_seconds / wall_seconds;
        let machine_cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
        Some(CpuShare {
            cpu_seconds,
            wall_seconds,
            cores,
            machine_share: cores / machine_cores,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_rss_is_read_in_bytes() {
        let status =
            "Name:\trebate-query\nVmPeak:\t  900000 kB\nVmRSS:\t   51200 kB\nThreads:\t4\n";
        assert_eq!(parse_vm_rss(status), Some(51_200 * 1024));
        assert_eq!(parse_vm_rss("Name:\tx\n"), None);
    }

    #[test]
    fn cpu_ticks_survive_a_name_with_spaces_and_parentheses() {
        let stat = "4242 (tokio (rt) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 4 0";
        assert_eq!(parse_cpu_ticks(stat), Some(325));
        assert_eq!(parse_cpu_ticks("garbage"), None);
    }

    #[test]
    fn this_process_can_be_measured() {
        let pid = std::process::id();
        assert!(rss_bytes(pid).is_some_and(|rss| rss > 0));
        assert!(cpu_ticks(None).is_some());
        let meter = CpuMeter::start(None, clock_ticks_per_second());
        let share = meter.read().unwrap();
        assert!(share.cpu_seconds >= 0.0 && share.machine_share >= 0.0);
    }
}
