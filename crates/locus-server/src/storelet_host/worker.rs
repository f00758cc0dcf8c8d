//! A storelet worker thread: runs one job under its subject's CPU budget at the lowest
//! scheduling priority, streams its output as events to the job's watcher, and records
//! what the run cost.

use super::{Core, Ended, Job, Seen, Submission, LOG_KEPT, WORKER_NICE};
use locus_proto::types::{StoreletLogEntry, StoreletResult};
use locus_storelet::{Account, RunControl, RunSpec, StoreletError};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;

/// The tree a data node's share runs over: made now from its files (and perhaps kept),
/// or kept from an earlier run.
enum ShareTree {
    Make(Vec<(String, locus_storelet::TreeFile)>, Option<super::KeepTree>),
    Kept(Arc<locus_storelet::Tree>),
}

/// Puts the calling thread in the SCHED_IDLE class: it runs only when no other thread
/// wants the CPU, and any waking file-service thread preempts it at once (a low nice
/// value alone still lets a busy thread finish its time slice first).
pub(super) fn lowest_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: plain system call on the calling thread (pid 0) with a valid parameter.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
        if let Err(e) = rustix::process::setpriority_process(None, WORKER_NICE) {
            tracing::debug!("storelet worker keeps its priority: {e}");
        }
    }
}

fn result_of(run: u64, module: String, exit_code: i32, a: &Account) -> StoreletResult {
    StoreletResult {
        run,
        module,
        exit_code,
        fuel: a.fuel,
        cpu_us: a.cpu.as_micros() as u64,
        peak_memory: a.peak_memory as u64,
        wall_us: a.wall.as_micros() as u64,
        output_bytes: a.output as u64,
        read_bytes: a.read_bytes,
        write_bytes: a.write_bytes,
        files_opened: a.files_opened,
    }
}

impl Core {
    /// Runs one job on this worker thread, telling its watcher how it goes.
    pub(super) fn execute(&self, job: Job) {
        let Job { run, submission: mut s, control, watcher } = job;
        let module_hash = {
            let mut state = self.state.lock();
            let Some(live) = state.runs.get_mut(&run) else { return };
            live.running = true;
            live.module.clone()
        };
        watcher.started(run, &module_hash);
        let watcher = Arc::new(parking_lot::Mutex::new(Some(watcher)));
        let (sink_watcher, sink_control) = (watcher.clone(), control.clone());
        let sink: locus_storelet::OutputSink = Arc::new(move |stream, bytes| {
            let keep_going = sink_watcher.lock().as_ref().is_some_and(|w| w.output(stream, bytes));
            if !keep_going {
                sink_control.cancel();
            }
        });
        let mut argv = vec!["storelet".to_string()];
        argv.extend(s.args.iter().cloned());
        let outcome = if control.is_cancelled() {
            Err(locus_storelet::StoreletError::Cancelled { account: Account::default() })
        } else {
            match std::mem::replace(&mut s.view, Seen::Files(Vec::new(), None)) {
                Seen::Dir(view) => self.run_in_dir(run, &s, &view, &argv, &module_hash, sink, &control),
                Seen::Files(files, keep) => {
                    self.run_over_files(&s, ShareTree::Make(files, keep), &argv, &module_hash, sink, &control)
                }
                Seen::Tree(tree) => self.run_over_files(&s, ShareTree::Kept(tree), &argv, &module_hash, sink, &control),
            }
        };
        let (result, outcome_text) = match &outcome {
            Ok(out) => (result_of(run, module_hash, out.exit_code, &out.account), format!("exit {}", out.exit_code)),
            Err(e) => {
                let account = e.account().cloned().unwrap_or_default();
                (result_of(run, module_hash, -1, &account), format!("{}: {e}", e.code().name()))
            }
        };
        if let Err(StoreletError::Limit { limit, .. }) = &outcome {
            *self.state.lock().limits.entry(limit).or_default() += 1;
        }
        self.record(run, &s, outcome.is_ok(), &outcome_text, &result);
        let watcher = watcher.lock().take();
        if let Some(w) = watcher {
            w.finished(&result, &outcome);
        }
    }

    /// Runs a submission over its directory: a native handler confined to its layers, or
    /// a module with the directory preopened.
    #[allow(clippy::too_many_arguments)]
    fn run_in_dir(
        &self,
        run: u64,
        s: &Submission,
        view: &locus_store::CodeView,
        argv: &[String],
        module_hash: &str,
        sink: locus_storelet::OutputSink,
        control: &Arc<RunControl>,
    ) -> Result<locus_storelet::RunOutcome, StoreletError> {
        if let Some(program) = &s.native {
            let name = program.file_name().map_or("handler".into(), |n| n.to_string_lossy().into_owned());
            let mut argv = vec![name];
            argv.extend(s.args.iter().cloned());
            let scratch = self.native_roots.join(format!("run-{run}"));
            let outcome = locus_storelet::native::run_native(locus_storelet::native::NativeSpec {
                program,
                args: &argv,
                layers: &view.layers,
                scratch: &scratch,
                limits: self.config.limits,
                output: sink,
                control: control.clone(),
            });
            let _ = std::fs::remove_dir(&scratch);
            return outcome;
        }
        // The directory was resolved beneath the root; its /proc entry names exactly it.
        let dir = PathBuf::from(format!("/proc/self/fd/{}", view.dir.as_raw_fd()));
        let (_, module) = self.runner.module_hashed(module_hash.to_string(), &s.wasm)?;
        let mut spec = RunSpec::new(argv, self.config.limits).dir(&dir, s.write);
        spec.env = &s.env;
        spec.output = Some(sink);
        spec.control = control.clone();
        spec.record_inputs = s.record_inputs;
        self.runner.run(&module, spec)
    }

    /// Runs a module over a tree of `files` (a data node's share of a cluster run).
    fn run_over_files(
        &self,
        s: &Submission,
        tree: ShareTree,
        argv: &[String],
        module_hash: &str,
        sink: locus_storelet::OutputSink,
        control: &Arc<RunControl>,
    ) -> Result<locus_storelet::RunOutcome, StoreletError> {
        let started = std::time::Instant::now();
        let cpu_started = locus_storelet::thread_cpu();
        let (tree, keep) = match tree {
            ShareTree::Kept(tree) => (tree, None),
            ShareTree::Make(files, keep) => {
                let mut tree = locus_storelet::Tree::new();
                for (path, file) in files {
                    tree.add(&path, file).map_err(StoreletError::Setup)?;
                }
                (Arc::new(tree), keep)
            }
        };
        let (_, module) = self.runner.module_hashed(module_hash.to_string(), &s.wasm)?;
        let mut spec = RunSpec::new(argv, self.config.limits);
        spec.tree = Some(tree.clone());
        spec.env = &s.env;
        spec.output = Some(sink);
        spec.control = control.clone();
        let mut outcome = self.runner.run(&module, spec);
        // A tree is kept for later runs once a run over it ended well.
        if let (Ok(_), Some(keep)) = (&outcome, keep) {
            keep(tree);
        }
        // The run's time includes making its tree.
        let made = locus_storelet::thread_cpu().saturating_sub(cpu_started);
        if let Ok(out) = &mut outcome {
            out.account.wall = started.elapsed();
            out.account.cpu = made.max(out.account.cpu);
        }
        outcome
    }

    /// Accounts for a finished run: subject totals, the recent log, the accounts file.
    fn record(&self, run: u64, s: &Submission, completed: bool, outcome: &str, result: &StoreletResult) {
        tracing::info!(
            run,
            subject = %s.subject,
            module = %result.module.get(..12).unwrap_or(&result.module),
            outcome,
            fuel = result.fuel,
            cpu_us = result.cpu_us,
            peak_memory = result.peak_memory,
            wall_us = result.wall_us,
            read_bytes = result.read_bytes,
            write_bytes = result.write_bytes,
            files = result.files_opened,
            output = result.output_bytes,
            "storelet finished"
        );
        let line = format!(
            "{} run={run} subject={} module={} outcome={:?} fuel={} cpu_us={} peak_memory={} wall_us={} read_bytes={} write_bytes={} files={} output={}\n",
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            s.subject,
            result.module,
            outcome,
            result.fuel,
            result.cpu_us,
            result.peak_memory,
            result.wall_us,
            result.read_bytes,
            result.write_bytes,
            result.files_opened,
            result.output_bytes,
        );
        if let Err(e) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.accounts_file)
            .and_then(|mut f| f.write_all(line.as_bytes()))
        {
            tracing::warn!("cannot append to {}: {e}", self.accounts_file.display());
        }
        let mut state = self.state.lock();
        let submitted_ms = state.runs.remove(&run).map_or(0, |r| r.submitted_ms);
        let t = &mut state.subject(&s.subject, &self.config).totals;
        t.runs += 1;
        t.stopped += u64::from(!completed);
        t.cpu_us += result.cpu_us;
        t.fuel += result.fuel;
        t.read_bytes += result.read_bytes;
        t.write_bytes += result.write_bytes;
        if state.log.len() == LOG_KEPT {
            state.log.pop_front();
        }
        state.log.push_back(Ended {
            entry: StoreletLogEntry {
                subject: s.subject.clone(),
                args: s.args.clone(),
                outcome: outcome.to_string(),
                account: result.clone(),
            },
            active_file: s.active_file.clone(),
            submitted_ms,
        });
    }
}

/// An account in words, for error messages.
pub(super) fn describe(a: &Account) -> String {
    format!(
        "{} fuel, {:?} CPU, {} bytes of memory, {:?} wall time, {} bytes read, {} written, {} files opened, {} bytes of output",
        a.fuel, a.cpu, a.peak_memory, a.wall, a.read_bytes, a.write_bytes, a.files_opened, a.output
    )
}
