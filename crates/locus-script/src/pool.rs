//! The hand-off between the connections' threads and the interpreter threads: which
//! interpreters are idle and the calls waiting for one, under one lock, so a call either
//! goes to an idle interpreter or waits while none is idle, and an interpreter looks at
//! the waiting calls before it says it is idle. No call waits behind a long one while
//! another interpreter is free.
//!
//! An idle interpreter of the caller's CPU is preferred: handing a call to a thread on
//! the same CPU, and the answer back, is a context switch; handing it to a sleeping
//! thread on another CPU costs a cross-CPU wake-up each way, which on a virtual machine
//! is tens of microseconds.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::mpsc;

/// Workers (by number) and the jobs `T` waiting for them.
pub(crate) struct Pool<T> {
    state: Mutex<State<T>>,
}

struct State<T> {
    /// Each worker's channel for a job handed to it while idle (emptied when the pool
    /// closes, which ends the workers).
    hand: Vec<mpsc::SyncSender<T>>,
    /// The CPU each worker is held to.
    cpu: Vec<usize>,
    /// The idle workers, the most recently idle last.
    idle: Vec<usize>,
    /// Jobs that found every worker busy, oldest first.
    waiting: VecDeque<T>,
    /// The most jobs that may wait.
    queue: usize,
    /// Workers that have not ended.
    alive: usize,
}

impl<T> Pool<T> {
    /// A pool with no workers yet, where at most `queue` jobs may wait.
    pub(crate) fn new(queue: usize) -> Pool<T> {
        let state =
            State { hand: Vec::new(), cpu: Vec::new(), idle: Vec::new(), waiting: VecDeque::new(), queue, alive: 0 };
        Pool { state: Mutex::new(state) }
    }

    /// A new worker held to `cpu`: its number and where its jobs come, for [`Pool::next`].
    pub(crate) fn add_worker(&self, cpu: usize) -> (usize, mpsc::Receiver<T>) {
        // Capacity one: a job is handed only to an idle worker, which holds none.
        let (tx, rx) = mpsc::sync_channel(1);
        let mut st = self.state.lock();
        st.hand.push(tx);
        st.cpu.push(cpu);
        st.alive += 1;
        (st.hand.len() - 1, rx)
    }

    /// Worker `w` has ended (its thread could not start, could not make what it needs,
    /// or panicked): it is idle no more, and when it was the last, the pool closes, so
    /// no job waits for a worker that will never come.
    pub(crate) fn retire(&self, w: usize) {
        let last = {
            let mut st = self.state.lock();
            st.idle.retain(|&i| i != w);
            st.alive = st.alive.saturating_sub(1);
            st.alive == 0
        };
        if last {
            self.close();
        }
    }

    /// Gives `job` to an idle worker (of `cpu` if one is), else queues it; hands it back
    /// when the queue is full or the pool is closed.
    pub(crate) fn dispatch(&self, job: T, cpu: usize) -> Result<(), T> {
        let mut st = self.state.lock();
        let mut job = job;
        while !st.idle.is_empty() {
            let at = st.idle.iter().rposition(|&w| st.cpu[w] == cpu).unwrap_or(st.idle.len() - 1);
            let w = st.idle.swap_remove(at);
            match st.hand[w].try_send(job) {
                Ok(()) => return Ok(()),
                // Its thread is gone (it ended before retiring); try another.
                Err(mpsc::TrySendError::Disconnected(j)) | Err(mpsc::TrySendError::Full(j)) => job = j,
            }
        }
        if st.hand.is_empty() || st.waiting.len() >= st.queue {
            return Err(job);
        }
        st.waiting.push_back(job);
        Ok(())
    }

    /// The next job of worker `w` (whose channel is `rx`): the oldest waiting one, else
    /// one handed to it after it says it is idle. `None` once the pool is closed.
    pub(crate) fn next(&self, w: usize, rx: &mpsc::Receiver<T>) -> Option<T> {
        {
            let mut st = self.state.lock();
            if let Some(job) = st.waiting.pop_front() {
                return Some(job);
            }
            if st.hand.is_empty() {
                return None;
            }
            st.idle.push(w);
        }
        rx.recv().ok()
    }

    /// Ends the workers (idle ones at once, busy ones after their job) and drops the
    /// waiting jobs (after letting go of the lock: dropping a job may answer its caller).
    pub(crate) fn close(&self) {
        let waiting = {
            let mut st = self.state.lock();
            st.hand.clear();
            st.idle.clear();
            std::mem::take(&mut st.waiting)
        };
        drop(waiting);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    /// A job: how long it takes, and where to say which it was when done.
    type Job = (&'static str, Duration, mpsc::Sender<&'static str>);

    /// A pool of `workers` threads on CPU 0 that run such jobs.
    fn pool(workers: usize, queue: usize) -> Arc<Pool<Job>> {
        let pool = Arc::new(Pool::<Job>::new(queue));
        for _ in 0..workers {
            let (w, rx) = pool.add_worker(0);
            let pool = pool.clone();
            std::thread::spawn(move || {
                while let Some((name, takes, done)) = pool.next(w, &rx) {
                    std::thread::sleep(takes);
                    let _ = done.send(name);
                }
            });
        }
        // Every worker idle (as `next` leaves them) before the test begins.
        while pool.state.lock().idle.len() < workers {
            std::thread::sleep(Duration::from_millis(1));
        }
        pool
    }

    fn first(answers: &mpsc::Receiver<&'static str>) -> &'static str {
        answers.recv_timeout(Duration::from_secs(10)).expect("an answer")
    }

    const LONG: Duration = Duration::from_millis(1500);

    #[test]
    fn a_job_never_waits_behind_a_long_one_while_a_worker_is_idle() {
        let pool = pool(2, 16);
        let (tx, answers) = mpsc::channel();
        // Back to back, before either worker has woken: the short one must not queue
        // behind the long one.
        for _ in 0..3 {
            pool.dispatch(("long", LONG, tx.clone()), 0).map_err(drop).unwrap();
            pool.dispatch(("short", Duration::ZERO, tx.clone()), 0).map_err(drop).unwrap();
            assert_eq!(first(&answers), "short");
            assert_eq!(first(&answers), "long");
        }
    }

    #[test]
    fn a_job_that_finds_every_worker_busy_goes_to_the_first_to_finish() {
        let pool = pool(2, 16);
        let (tx, answers) = mpsc::channel();
        pool.dispatch(("long", LONG, tx.clone()), 0).map_err(drop).unwrap();
        pool.dispatch(("medium", Duration::from_millis(300), tx.clone()), 0).map_err(drop).unwrap();
        while !pool.state.lock().idle.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
        pool.dispatch(("queued", Duration::ZERO, tx.clone()), 0).map_err(drop).unwrap();
        assert_eq!(first(&answers), "medium");
        assert_eq!(first(&answers), "queued", "taken by the worker that finished first");
        assert_eq!(first(&answers), "long");
    }

    #[test]
    fn a_full_queue_refuses_and_a_closed_pool_drops_what_waits() {
        let pool = pool(1, 1);
        let (tx, answers) = mpsc::channel();
        pool.dispatch(("long", LONG, tx.clone()), 0).map_err(drop).unwrap();
        pool.dispatch(("waiting", Duration::ZERO, tx.clone()), 0).map_err(drop).unwrap();
        assert!(pool.dispatch(("refused", Duration::ZERO, tx.clone()), 0).is_err(), "the queue is full");
        pool.close();
        assert!(pool.dispatch(("late", Duration::ZERO, tx.clone()), 0).is_err(), "closed");
        drop(tx);
        assert_eq!(first(&answers), "long", "a running job ends as it would");
        assert!(answers.recv_timeout(Duration::from_secs(2)).is_err(), "the waiting job was dropped, not run");
    }

    #[test]
    fn when_the_last_worker_ends_what_waits_is_dropped_and_nothing_more_queues() {
        let pool: Pool<u32> = Pool::new(4);
        let (a, ra) = pool.add_worker(0);
        let (b, _rb) = pool.add_worker(0);
        pool.state.lock().idle.extend([a, b]);
        pool.retire(b);
        pool.dispatch(1, 0).unwrap();
        assert_eq!(ra.try_recv(), Ok(1), "not to the retired worker");
        pool.dispatch(2, 0).unwrap();
        assert_eq!(pool.state.lock().waiting.len(), 1);
        pool.retire(a);
        assert!(pool.state.lock().waiting.is_empty(), "dropped: no worker would take it");
        assert_eq!(pool.dispatch(3, 0), Err(3), "refused: the pool is closed");
        assert_eq!(pool.next(a, &ra), None);
    }

    #[test]
    fn an_idle_worker_of_the_callers_cpu_is_preferred() {
        let pool: Pool<u32> = Pool::new(4);
        let (a, ra) = pool.add_worker(0);
        let (b, rb) = pool.add_worker(1);
        // Both idle (as `next` leaves them), the one on CPU 1 first.
        pool.state.lock().idle.extend([b, a]);
        pool.dispatch(7, 0).unwrap();
        assert_eq!(ra.try_recv(), Ok(7));
        pool.dispatch(8, 0).unwrap();
        assert_eq!(rb.try_recv(), Ok(8), "another CPU's when this one's is busy");
        pool.dispatch(9, 0).unwrap();
        assert_eq!(pool.next(a, &ra), Some(9), "waiting for the first to ask");
    }
}
