//! What `/proc` says about a process: resident memory (`VmRSS` in `/proc/<pid>/status`) and CPU
//! time (`utime` + `stime` in `/proc/<pid>/stat`, and per thread in
//! `/proc/self/task/<tid>/stat`). The chaos suite and the soak sample the service's RSS against
//! its cache budgets, and the harness's own CPU to say how much of the 2-core machine the
//! generator took from the service; the `run` scenarios read this process's threads one by one
//! so that the in-process ceiling's CPU is not counted as the generator's.

use std::sync::OnceLock;
use std::time::Instant;

/// Clock ticks per second of `/proc/<pid>/stat` times (`getconf CLK_TCK`; 100 on Linux). Asked
/// once per process: it is a constant of the kernel, and `getconf` is a child process.
pub fn clock_ticks_per_second() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|output| String::from_utf8(output.stdout).ok())
            .and_then(|text| text.trim().parse::<f64>().ok())
            .filter(|ticks| *ticks > 0.0)
            .unwrap_or(100.0)
    })
}

/// The cores this process may run on (`sched_getaffinity`, cgroup quota), at least 1.
pub fn machine_cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// This process's soft limit on open files (`Max open files` in `/proc/self/limits`), `None`
/// where it cannot be read or is unlimited. Every request in flight holds a connection, so the
/// harness keeps its in-flight bounds below it.
pub fn open_files_limit() -> Option<u64> {
    parse_open_files_limit(&std::fs::read_to_string("/proc/self/limits").ok()?)
}

/// The soft limit of the `Max open files` line of a `/proc/<pid>/limits` text.
pub fn parse_open_files_limit(limits: &str) -> Option<u64> {
    let line = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
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

/// The command name (field 2, `comm`: a thread's name, at most 15 bytes) and `utime + stime`
/// of a `/proc/<pid>/stat` or `/proc/<pid>/task/<tid>/stat` line.
pub fn parse_name_and_cpu_ticks(stat: &str) -> Option<(&str, u64)> {
    let name = stat.get(stat.find('(')? + 1..stat.rfind(')')?)?;
    Some((name, parse_cpu_ticks(stat)?))
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

/// Where the CPU time of a load's target is read, so that each run can set the generator's CPU
/// beside its target's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuSource {
    /// Not read (a test server, or a target the harness did not start).
    #[default]
    Unmeasured,
    /// A process of its own, e.g. the service: `/proc/<pid>/stat`, all its threads.
    Process(u32),
    /// The threads of this process that bear this name, e.g. the in-process ceiling's runtime.
    OwnThreads(&'static str),
}

/// One live thread of this process: its id, its name as the kernel keeps it (`comm`) and the
/// CPU ticks it has used so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadCpu {
    pub tid: u32,
    pub name: String,
    pub ticks: u64,
}

/// Every live thread of this process, from `/proc/self/task/*/stat` (one read per thread: the
/// name is in the same line). Threads that already exited are not listed; their CPU is still
/// in the process's own total ([`cpu_ticks`]`(None)`).
pub fn own_threads() -> Vec<ThreadCpu> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| {
            let tid = task.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
            let (name, ticks) = parse_name_and_cpu_ticks(&stat)?;
            Some(ThreadCpu {
                tid,
                name: name.to_owned(),
                ticks,
            })
        })
        .collect()
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
        Some(CpuShare {
            cpu_seconds,
            wall_seconds,
            cores,
            machine_share: cores / machine_cores() as f64,
        })
    }
}

/// A thread of this process, named, that has used at least some CPU ticks and stays alive until
/// [`SpunThread::finish`]: what the tests that read `/proc` measure.
#[cfg(test)]
pub(crate) struct SpunThread {
    handle: std::thread::JoinHandle<Option<(String, u64)>>,
    release: std::sync::Arc<std::sync::Barrier>,
}

#[cfg(test)]
impl SpunThread {
    /// Starts a thread named `name` and returns once the kernel has charged it `ticks` ticks (a
    /// condition on its own counter, not on time; a failed read of its stat ends the spin).
    pub(crate) fn start(name: &str, ticks: u64) -> Self {
        use std::sync::{Arc, Barrier};
        let (spun, release) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
        let (spun_in_thread, release_in_thread) = (Arc::clone(&spun), Arc::clone(&release));
        let handle = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let own = || {
                    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
                    parse_name_and_cpu_ticks(&stat).map(|(name, ticks)| (name.to_owned(), ticks))
                };
                let mut seen = own();
                while seen.as_ref().is_some_and(|(_, used)| *used < ticks) {
                    seen = own();
                }
                spun_in_thread.wait();
                release_in_thread.wait();
                seen
            })
            .expect("a test thread starts");
        spun.wait();
        Self { handle, release }
    }

    /// Lets the thread end; its name and ticks as `/proc` last gave them.
    pub(crate) fn finish(self) -> (String, u64) {
        self.release.wait();
        self.handle
            .join()
            .expect("the test thread ends")
            .expect("/proc/thread-self/stat is readable")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_open_files_limit_is_read() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max processes             95008                95008                processes \n\
                      Max open files            20000                524288               files     \n";
        assert_eq!(parse_open_files_limit(limits), Some(20_000));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(parse_open_files_limit(unlimited), None);
        assert_eq!(parse_open_files_limit(""), None);
        assert!(open_files_limit().is_some_and(|limit| limit > 0));
    }

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
        assert_eq!(parse_name_and_cpu_ticks(stat), Some(("tokio (rt) x", 325)));
        assert_eq!(parse_name_and_cpu_ticks("garbage"), None);
    }

    #[test]
    fn a_named_thread_is_listed_under_its_name_with_the_cpu_it_used() {
        const NAME: &str = "procfs-test-15b"; // 15 bytes: the most `comm` keeps
        const TICKS: u64 = 2;
        let spinner = SpunThread::start(NAME, TICKS);
        let threads = own_threads();
        let (name, _) = spinner.finish();
        assert_eq!(name, NAME);
        let named: Vec<&ThreadCpu> = threads.iter().filter(|t| t.name == NAME).collect();
        assert_eq!(named.len(), 1, "{threads:?}");
        assert!(named[0].ticks >= TICKS, "{named:?}");
        assert!(
            threads
                .iter()
                .any(|thread| thread.tid == std::process::id()),
            "the main thread's id is the process's: {threads:?}"
        );
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
