//! llama-server's HTTP thread pool, which can leave a burst of new
//! connections unserved for seconds on a server with nothing to do.
//!
//! llama-server (llama.cpp's `tools/server`, through cpp-httplib 0.58)
//! serves each accepted connection as one job of a thread pool, and the
//! thread keeps the connection until it closes, idles 5 s or has carried
//! 100 requests (`process_server_socket_core`, `keep_alive`). The pool
//! starts `max(slots + 4, cores - 1)` threads (`server-http.cpp`: the
//! `n_threads_http` default) and may grow to 1 024 more; a thread added
//! that way ends after 3 s without a job. It adds one only when a job is
//! queued while it counts no thread idle (`ThreadPool::enqueue`), and a
//! thread told of a job still counts as idle until it runs and takes it
//! (`ThreadPool::worker`). So when the accept loop queues connections
//! faster than the threads it woke get a core — on a CPU server whose
//! compute threads and accept loop fill the machine's cores while it
//! computes — the pool counts idle threads to the end of the burst and
//! adds none: as many connections as there were idle threads are served,
//! and the rest wait, first in first out, for a thread to come free. A
//! connection queued while none counts idle adds a thread, which takes
//! the oldest queued job, not its own.
//!
//! The pool here is that state machine over the simulated server's
//! accepted connections. Which threads wait for a core is the model's one
//! judgement: a thread told of a job while the server's [`Cpu`] is
//! crowded and its engine computes runs [`WOKEN_AFTER`] later, after every
//! connection of that instant was queued; otherwise at once.
//!
//! [`Cpu`]: crate::scenario::kinds::Cpu

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

/// How long a thread told of a job waits for a core on a crowded machine:
/// the scheduler's wake-up latency on a busy core, about a millisecond,
/// and in any case after the connections that arrived with it were queued.
pub(super) const WOKEN_AFTER: Duration = Duration::from_millis(1);

/// Threads the pool may add beyond its first (`server-http.cpp`:
/// `n_threads_http + 1024`).
const MAX_ADDED: u32 = 1024;

/// How long an added thread waits for a job before it ends (cpp-httplib's
/// `CPPHTTPLIB_THREAD_POOL_IDLE_TIMEOUT`).
const ADDED_IDLE: Duration = Duration::from_secs(3);

/// One of the pool's threads: one of its first, which lives as long as
/// the process, or one it added, which ends after [`ADDED_IDLE`] idle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Thread {
    /// Started with the pool.
    First,
    /// Added for a job queued while none counted idle.
    Added,
}

/// What the accept loop starts for a connection it queued.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Start<J> {
    /// A thread that runs now, serving `J` (and then whatever
    /// [`HttpPool::finished`] gives it).
    Serve(Thread, J),
    /// A thread told of a job that runs only [`WOKEN_AFTER`] from now,
    /// and then takes the oldest queued job, if any is left
    /// ([`HttpPool::woke`]).
    Woken(Thread),
}

/// The pool of one life of a llama-server process, over jobs `J` (its
/// accepted connections).
#[derive(Debug)]
pub(super) struct HttpPool<J> {
    /// Threads at most.
    most: u32,
    /// Whether a thread told of a job waits for a core while the engine
    /// computes.
    crowded: bool,
    state: Mutex<State<J>>,
}

#[derive(Debug)]
struct State<J> {
    /// Connections accepted and not yet taken by a thread, oldest first.
    jobs: VecDeque<J>,
    /// Threads alive.
    threads: u32,
    /// cpp-httplib's `idle_thread_count_`: the threads waiting for a job,
    /// and those told of one that have not run yet.
    idle: u32,
    /// The threads waiting and not told, longest waiting first, with the
    /// instant each began to wait.
    waiting: VecDeque<(Thread, Duration)>,
}

impl<J> HttpPool<J> {
    /// The pool llama-server starts with `slots` slots on a machine of
    /// `cores` cores (when the scenario says; else as many first threads
    /// as the slots ask), `crowded` when its compute threads and accept
    /// loop fill those cores.
    pub(super) fn new(slots: u32, cores: Option<u32>, crowded: bool, now: Duration) -> Self {
        let first = slots.saturating_add(4).max(cores.unwrap_or(0).saturating_sub(1));
        HttpPool {
            most: first.saturating_add(MAX_ADDED),
            crowded,
            state: Mutex::new(State {
                jobs: VecDeque::new(),
                threads: first,
                idle: first,
                waiting: std::iter::repeat_n((Thread::First, now), first as usize).collect(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<J>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues the connection `job` accepted at `now`, `computing` telling
    /// whether the engine is at work; returns the thread to start, if one
    /// is told or added.
    pub(super) fn accept(&self, job: J, computing: bool, now: Duration) -> Option<Start<J>> {
        let mut st = self.lock();
        st.expire(now);
        st.jobs.push_back(job);
        if st.idle == 0 && st.threads < self.most {
            // A thread is added, and takes the oldest job when it runs.
            st.threads += 1;
            let oldest = st.jobs.pop_front()?;
            return Some(Start::Serve(Thread::Added, oldest));
        }
        // One waiting thread is told; with none (every idle one told
        // already), the job waits for one of them to run.
        let (thread, _) = st.waiting.pop_front()?;
        if self.crowded && computing {
            return Some(Start::Woken(thread));
        }
        st.idle -= 1;
        let oldest = st.jobs.pop_front()?;
        Some(Start::Serve(thread, oldest))
    }

    /// A told `thread` runs at `now`: it takes the oldest queued job, or
    /// waits again when the others have taken them all.
    pub(super) fn woke(&self, thread: Thread, now: Duration) -> Option<J> {
        let mut st = self.lock();
        st.idle = st.idle.saturating_sub(1);
        st.take_or_wait(thread, now)
    }

    /// `thread`'s connection closed at `now`: it takes the oldest queued
    /// job, or waits for one.
    pub(super) fn finished(&self, thread: Thread, now: Duration) -> Option<J> {
        let mut st = self.lock();
        st.expire(now);
        st.take_or_wait(thread, now)
    }

    /// Connections accepted and waiting for a thread.
    #[cfg(test)]
    fn queued(&self) -> usize {
        self.lock().jobs.len()
    }

    /// Threads alive, as of `now`.
    #[cfg(test)]
    fn threads(&self, now: Duration) -> u32 {
        let mut st = self.lock();
        st.expire(now);
        st.threads
    }
}

impl<J> State<J> {
    fn take_or_wait(&mut self, thread: Thread, now: Duration) -> Option<J> {
        let job = self.jobs.pop_front();
        if job.is_none() {
            self.idle += 1;
            self.waiting.push_back((thread, now));
        }
        job
    }

    /// Ends the added threads that have waited [`ADDED_IDLE`] by `now`.
    fn expire(&mut self, now: Duration) {
        let before = self.waiting.len();
        self.waiting
            .retain(|(thread, since)| *thread == Thread::First || now.saturating_sub(*since) < ADDED_IDLE);
        let ended = u32::try_from(before - self.waiting.len()).unwrap_or(u32::MAX);
        self.threads = self.threads.saturating_sub(ended);
        self.idle = self.idle.saturating_sub(ended);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Duration = Duration::from_secs(6);

    /// Accepts `n` connections numbered from `from` at `now`, returning
    /// what each started.
    fn burst(pool: &HttpPool<u32>, from: u32, n: u32, computing: bool, now: Duration) -> Vec<Option<Start<u32>>> {
        (from..from + n).map(|j| pool.accept(j, computing, now)).collect()
    }

    /// With a free core every told thread runs at once: the idle count
    /// falls with each connection, and past it the pool adds threads.
    #[test]
    fn a_burst_on_a_free_core_is_served_whole() {
        let pool = HttpPool::new(2, Some(2), true, Duration::ZERO);
        let started = burst(&pool, 0, 20, false, T0);
        assert_eq!(pool.queued(), 0);
        assert!(started.iter().all(|s| matches!(s, Some(Start::Serve(..)))));
        let added = started
            .iter()
            .filter(|s| matches!(s, Some(Start::Serve(Thread::Added, _))))
            .count();
        assert_eq!(added, 20 - 6, "6 first threads, then one added a connection");
    }

    /// The trace of a real burst: with the core busy, the six first
    /// threads are told and counted idle to the end, no thread is added,
    /// and fourteen connections wait.
    #[test]
    fn a_burst_while_the_engine_computes_on_a_crowded_machine_waits_for_threads() {
        let pool = HttpPool::new(2, Some(2), true, Duration::ZERO);
        let started = burst(&pool, 0, 20, true, T0);
        let woken = started.iter().filter(|s| matches!(s, Some(Start::Woken(_)))).count();
        assert_eq!(woken, 6);
        assert!(started[6..].iter().all(Option::is_none), "{started:?}");
        assert_eq!(pool.queued(), 20);
        // The told threads run and take the oldest six.
        let taken: Vec<_> = (0..6)
            .filter_map(|_| pool.woke(Thread::First, T0 + WOKEN_AFTER))
            .collect();
        assert_eq!(taken, [0, 1, 2, 3, 4, 5]);
        assert_eq!(pool.queued(), 14);
        // A connection queued now counts no thread idle, adds one, and the
        // new thread takes the oldest waiting job, not the new one.
        let later = pool.accept(100, true, T0 + Duration::from_secs(3));
        assert_eq!(later, Some(Start::Serve(Thread::Added, 6)));
        // A thread whose connection closes takes the next oldest.
        assert_eq!(pool.finished(Thread::First, T0 + Duration::from_secs(3)), Some(7));
    }

    /// A machine with cores to spare never queues: its told threads run
    /// before the next connection is accepted.
    #[test]
    fn a_machine_with_cores_to_spare_serves_a_burst_while_it_computes() {
        let pool = HttpPool::new(2, Some(16), false, Duration::ZERO);
        let started = burst(&pool, 0, 40, true, T0);
        assert_eq!(pool.queued(), 0);
        assert!(started.iter().all(Option::is_some));
        assert_eq!(pool.threads(T0), 40, "15 first threads (cores - 1), 25 added");
    }

    /// An added thread ends after 3 s idle; a first one never does.
    #[test]
    fn an_added_thread_ends_after_3_s_without_a_job() {
        let pool = HttpPool::new(1, None, false, Duration::ZERO);
        let started = burst(&pool, 0, 7, false, T0);
        assert_eq!(pool.threads(T0), 7, "5 first threads (slots + 4), 2 added");
        for start in started {
            let Some(Start::Serve(thread, _)) = start else {
                panic!("{start:?}")
            };
            assert_eq!(pool.finished(thread, T0), None);
        }
        assert_eq!(pool.threads(T0 + Duration::from_millis(2999)), 7);
        assert_eq!(pool.threads(T0 + ADDED_IDLE), 5);
    }

    /// A told thread that finds the jobs taken waits again, idle.
    #[test]
    fn a_told_thread_that_finds_no_job_waits_again() {
        let pool = HttpPool::new(2, Some(2), true, Duration::ZERO);
        assert_eq!(pool.accept(0, false, T0), Some(Start::Serve(Thread::First, 0)));
        assert_eq!(pool.accept(1, true, T0), Some(Start::Woken(Thread::First)));
        // Before it runs, the thread whose connection closed takes the job.
        assert_eq!(pool.finished(Thread::First, T0), Some(1));
        assert_eq!(pool.woke(Thread::First, T0 + WOKEN_AFTER), None);
        // It counts idle again: the next connection adds no thread.
        assert_eq!(pool.accept(2, false, T0), Some(Start::Serve(Thread::First, 2)));
        assert_eq!(pool.threads(T0), 6);
    }
}
