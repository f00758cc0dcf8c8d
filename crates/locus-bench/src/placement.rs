//! Where a benchmark runs its clients and its servers on the machine's CPUs.
//!
//! On a VM whose idle CPUs halt, a wake-up that crosses CPUs costs tens of microseconds
//! while one on the same CPU costs a few, and the scheduler tends to keep a request/reply
//! pair in whichever of the two states it fell into. Unpinned, one pair (say the
//! in-process ping-pong) can sit on one CPU while another (a client and a server process)
//! sits on two, and their ratio then compares two different machines. Pinning puts every
//! target, the floor included, in the same state.
//!
//! [`Placement::apply`] pins the calling thread (the benchmark's clients, and every thread
//! and process it starts afterwards) and records where servers go; [`server_command`] and
//! [`pin_server_thread`] put a server process or an in-process server thread there.

use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::OnceLock;

/// How clients and servers share the CPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Placement {
    /// Clients on the first CPU, servers on all others: every request wakes another CPU,
    /// as between two machines.
    Spread,
    /// Clients and servers on the first CPU: no wake-up crosses CPUs, so each request's
    /// CPU cost shows.
    Shared,
    /// No pinning: the scheduler places every thread.
    Free,
}

/// CPUs for servers, once [`Placement::apply`] has pinned the clients.
static SERVER_CPUS: OnceLock<CpuSet> = OnceLock::new();

impl Placement {
    /// Pins the calling thread to the clients' CPU and records the servers' CPUs. Call it
    /// before starting threads or servers. Returns a line describing what was done.
    pub fn apply(self) -> std::io::Result<String> {
        if self == Placement::Free {
            return Ok("placement: free (not pinned)".into());
        }
        let cpus = cpus_of(&sched_getaffinity(None)?);
        let Some(&client) = cpus.first() else {
            return Ok("placement: free (no CPU list)".into());
        };
        let placement = if cpus.len() < 2 { Placement::Shared } else { self };
        let servers: Vec<usize> = match placement {
            Placement::Spread => cpus[1..].to_vec(),
            _ => vec![client],
        };
        sched_setaffinity(None, &set_of(&[client]))?;
        let _ = SERVER_CPUS.set(set_of(&servers));
        locus_testkit::peers::on_server_start(|cmd| {
            server_command(cmd);
        });
        let name = if placement == self { self.name() } else { "shared (one CPU only)" };
        Ok(format!("placement: {name}, clients on cpu {client}, servers on cpus {servers:?}"))
    }

    /// The name `--placement` takes.
    fn name(self) -> &'static str {
        match self {
            Placement::Spread => "spread",
            Placement::Shared => "shared",
            Placement::Free => "free",
        }
    }
}

/// The CPU numbers in `set`.
fn cpus_of(set: &CpuSet) -> Vec<usize> {
    (0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect()
}

fn set_of(cpus: &[usize]) -> CpuSet {
    let mut set = CpuSet::new();
    for &c in cpus {
        set.set(c);
    }
    set
}

/// Makes a server process started by `cmd` run on the servers' CPUs (if pinned).
pub fn server_command(cmd: &mut Command) -> &mut Command {
    if let Some(set) = SERVER_CPUS.get().cloned() {
        // SAFETY: the closure only makes one system call, which is safe between fork and exec.
        unsafe {
            cmd.pre_exec(move || sched_setaffinity(None, &set).map_err(std::io::Error::from));
        }
    }
    cmd
}

/// Moves the calling thread, which serves requests, to the servers' CPUs (if pinned).
pub fn pin_server_thread() {
    if let Some(set) = SERVER_CPUS.get() {
        let _ = sched_setaffinity(None, set);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_keeps_servers_off_the_clients_cpu() {
        // The test runs on its own thread, so pinning it touches no other test.
        let allowed = cpus_of(&sched_getaffinity(None).unwrap());
        let line = Placement::Spread.apply().unwrap();
        let client = cpus_of(&sched_getaffinity(None).unwrap());
        assert_eq!(client, vec![allowed[0]], "{line}");
        let expected_servers = if allowed.len() > 1 { allowed[1..].to_vec() } else { client.clone() };

        let server_thread = std::thread::spawn(|| {
            pin_server_thread();
            cpus_of(&sched_getaffinity(None).unwrap())
        });
        assert_eq!(server_thread.join().unwrap(), expected_servers);

        let out = server_command(&mut Command::new("grep")).args(["Cpus_allowed_list", "/proc/self/status"]).output();
        let text = String::from_utf8(out.unwrap().stdout).unwrap();
        let listed = text.split_whitespace().nth(1).unwrap_or_default().to_string();
        let want = match expected_servers.as_slice() {
            [one] => one.to_string(),
            many => format!("{}-{}", many[0], many[many.len() - 1]),
        };
        assert_eq!(listed, want, "{line}");
    }
}
