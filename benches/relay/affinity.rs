//! CPU affinity (`sched_setaffinity`), for the own-core harm table: the database on one core,
//! this benchmark, the relay and the log-based consumer on another, as production has them
//! (the relay is a sidecar beside the application; only its SQL runs on the database host).
//!
//! A mask set on a thread is inherited by every thread and process it creates, so pinning
//! every thread of this process pins what it spawns later too (the harness spawns children
//! from a thread of its own).

use std::io;

/// The CPUs thread or process `tid` may run on (0: the calling thread).
pub fn allowed(tid: i32) -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is the empty set; sched_getaffinity writes at most its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Restricts thread `tid` (0: the calling one) to `cpus`.
fn pin_thread(tid: i32, cpus: &[usize]) -> io::Result<()> {
    // SAFETY: as in `allowed`; CPU_SET on indices below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Every thread of process `pid` restricted to `cpus` (what `taskset -a -p` does); threads it
/// creates afterwards inherit it.
pub fn pin_process(pid: u32, cpus: &[usize]) -> io::Result<()> {
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
        if let Some(tid) = entry.file_name().to_str().and_then(|t| t.parse().ok()) {
            // A thread that ended since the listing has nothing left to pin.
            match pin_thread(tid, cpus) {
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                other => other?,
            }
        }
    }
    Ok(())
}

/// This process's own mask, to give back when a group that moved it is done.
pub struct SavedMask {
    /// The main thread's CPUs when saved; every thread gets them back.
    cpus: Vec<usize>,
}

impl SavedMask {
    pub fn save() -> SavedMask {
        SavedMask {
            cpus: allowed(std::process::id() as i32),
        }
    }

    /// The CPUs this process may use (before any pinning of the group).
    pub fn cpus(&self) -> &[usize] {
        &self.cpus
    }
}

impl Drop for SavedMask {
    fn drop(&mut self) {
        if !self.cpus.is_empty() {
            let _ = pin_process(std::process::id(), &self.cpus);
        }
    }
}

/// `0-1`-style list of `cpus`, as `taskset -c` and /proc's `Cpus_allowed_list` write it.
pub fn list(cpus: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

// Run by selftest.rs (`cargo test --bench relay`): the bench has no libtest harness.
pub mod tests {
    use super::list;

    pub fn cpu_lists_are_written_as_ranges() {
        assert_eq!(list(&[0]), "0");
        assert_eq!(list(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(list(&[]), "");
    }
}
