//! CPU time and memory of processes, from /proc. On two shared cores the relay, PostgreSQL, the
//! SQS server and this benchmark compete for the same CPU, so each run says who used how much.

use std::collections::{BTreeMap, HashMap};

/// Fields of /proc/PID/stat this benchmark needs, times in seconds.
#[derive(Debug, Clone, Copy)]
struct Stat {
    /// The parent, to walk a process tree (the postmaster and its backends).
    ppid: i32,
    /// utime + stime of the process itself (all its threads).
    own: f64,
    /// cutime + cstime: children it has already reaped.
    reaped: f64,
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf only reads a constant of the system.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

fn read_stat(pid: i32) -> Option<(String, Stat)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may itself contain spaces or parentheses.
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text[open + 1..close].to_string();
    let fields: Vec<&str> = text[close + 2..].split_whitespace().collect();
    // Field numbers in proc(5) start at 1 with pid; fields[0] here is field 3 (state).
    let num = |field: usize| -> Option<f64> { fields.get(field - 3)?.parse().ok() };
    let tick = ticks_per_second();
    Some((
        comm,
        Stat {
            ppid: num(4)? as i32,
            own: (num(14)? + num(15)?) / tick,
            reaped: (num(16)? + num(17)?) / tick,
        },
    ))
}

/// utime + stime of one live process, in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    read_stat(pid as i32).map(|(_, s)| s.own)
}

/// Time a live process's threads have spent on a CPU, in seconds, from the scheduler's own
/// clock (/proc/PID/task/TID/schedstat, nanoseconds). Unlike /proc/PID/stat's utime + stime,
/// which charge whole clock ticks to whoever runs when one fires, this counts a backend that
/// wakes an idle core for 300 µs and sleeps again before the next tick: the rates group
/// measured a writer's backend at 50 commits/s as using no CPU at all by ticks.
pub fn run_seconds(pid: u32) -> Option<f64> {
    let mut ns = 0u64;
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let path = entry.path().join("schedstat");
        // A thread that ended since the listing has nothing more to count.
        if let Ok(text) = std::fs::read_to_string(path) {
            ns += text
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Some(ns as f64 / 1e9)
}

/// Peak resident set size (VmHWM) of a live process, in MiB.
pub fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// CPU seconds of a live process and all its descendants (reaped ones included), e.g. one
/// PostgreSQL cluster's postmaster and its backends.
pub fn tree_cpu_seconds(pid: u32) -> f64 {
    tree_seconds(&processes(), pid as i32)
}

/// A live process and all its descendants, e.g. a postmaster and every backend it has now.
pub fn tree(pid: u32) -> Vec<u32> {
    tree_of(&processes(), pid as i32)
        .into_iter()
        .map(|p| p as u32)
        .collect()
}

/// `root` and its descendants among `all`.
fn tree_of(all: &HashMap<i32, (String, Stat)>, root: i32) -> Vec<i32> {
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            all.iter()
                .filter(|(_, (_, s))| s.ppid == parent)
                .map(|(&child, _)| child),
        );
        i += 1;
    }
    found
}

/// CPU of one process tree at one moment, per process: to split a cluster's CPU between its
/// backends by who they serve.
#[derive(Debug, Clone, Default)]
pub struct TreeCpu {
    /// CPU time of each live process of the tree, by pid, from the scheduler's clock
    /// ([`run_seconds`]).
    pub own: BTreeMap<u32, f64>,
    /// cutime + cstime summed over the tree: processes that have exited (a postmaster's
    /// autovacuum workers, a backend whose connection closed), by clock ticks, all there is
    /// of them.
    pub reaped: f64,
}

impl TreeCpu {
    /// Everything the tree has used so far, the exited processes included.
    pub fn total(&self) -> f64 {
        self.own.values().sum::<f64>() + self.reaped
    }
}

/// [`TreeCpu`] of a live process and all its descendants.
pub fn tree_cpu(pid: u32) -> TreeCpu {
    let all = processes();
    let mut cpu = TreeCpu::default();
    for p in tree_of(&all, pid as i32) {
        if let (Some((_, stat)), Some(own)) = (all.get(&p), run_seconds(p as u32)) {
            cpu.own.insert(p as u32, own);
            cpu.reaped += stat.reaped;
        }
    }
    cpu
}

/// Every process on the machine: pid -> (command name, stat).
fn processes() -> HashMap<i32, (String, Stat)> {
    let mut all = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return all;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if let Some(stat) = read_stat(pid) {
            all.insert(pid, stat);
        }
    }
    all
}

/// CPU seconds of a process and all its descendants, including those already reaped.
fn tree_seconds(all: &HashMap<i32, (String, Stat)>, root: i32) -> f64 {
    let Some((_, stat)) = all.get(&root) else {
        return 0.0;
    };
    let children: f64 = all
        .iter()
        .filter(|(_, (_, s))| s.ppid == root)
        .map(|(&pid, _)| tree_seconds(all, pid))
        .sum();
    stat.own + stat.reaped + children
}

/// CPU used so far by the servers this benchmark started and by itself.
#[derive(Debug, Clone, Copy, Default)]
pub struct Snapshot {
    /// The PostgreSQL postmaster and every backend, worker and reaped child of it.
    pub postgres: f64,
    /// The fauxqs server (node), when it has been started.
    pub fauxqs: f64,
    /// This process: the minimal SQS sink, the producers, the ceiling loop and the polling.
    pub bench: f64,
    /// Busy and total CPU time of the whole machine, from /proc/stat.
    pub machine_busy: f64,
    /// See `machine_busy`.
    pub machine_total: f64,
}

impl Snapshot {
    pub fn take() -> Snapshot {
        let me = std::process::id() as i32;
        let all = processes();
        let child_named = |name: &str| {
            all.iter()
                .filter(|(_, (comm, s))| s.ppid == me && comm == name)
                .map(|(&pid, _)| tree_seconds(&all, pid))
                .sum::<f64>()
        };
        let (machine_busy, machine_total) = machine_times();
        Snapshot {
            postgres: child_named("postgres"),
            fauxqs: child_named("node"),
            bench: all.get(&me).map_or(0.0, |(_, s)| s.own),
            machine_busy,
            machine_total,
        }
    }

    /// CPU used between `earlier` and `self`.
    pub fn since(&self, earlier: &Snapshot) -> Snapshot {
        Snapshot {
            postgres: self.postgres - earlier.postgres,
            fauxqs: self.fauxqs - earlier.fauxqs,
            bench: self.bench - earlier.bench,
            machine_busy: self.machine_busy - earlier.machine_busy,
            machine_total: self.machine_total - earlier.machine_total,
        }
    }

    /// CPU the machine spent outside the benchmark's processes (`relay` given by the caller):
    /// anything else running at the same time, which makes the run's numbers unreliable.
    pub fn others(&self, relay: f64) -> f64 {
        (self.machine_busy - relay - self.postgres - self.fauxqs - self.bench).max(0.0)
    }

    /// Cores busy on average over the interval (2.0 = both cores of this machine flat out).
    pub fn busy_cores(&self, wall_seconds: f64) -> f64 {
        if wall_seconds <= 0.0 {
            return 0.0;
        }
        self.machine_busy / wall_seconds
    }
}

/// (busy, total) CPU seconds of all cores since boot; iowait counts as idle.
fn machine_times() -> (f64, f64) {
    let Ok(text) = std::fs::read_to_string("/proc/stat") else {
        return (0.0, 0.0);
    };
    let Some(line) = text.lines().find(|l| l.starts_with("cpu ")) else {
        return (0.0, 0.0);
    };
    let values: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let tick = ticks_per_second();
    let total: f64 = values.iter().take(8).sum();
    let idle = values.get(3).copied().unwrap_or(0.0) + values.get(4).copied().unwrap_or(0.0);
    ((total - idle) / tick, total / tick)
}
