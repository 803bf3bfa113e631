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
    /// First threads waiting and not told (a count: they never end, and a
    /// scenario's slots may be many).
    first_waiting: u32,
    /// Added threads waiting and not told, longest waiting first, with the
    /// instant each began to wait (at most [`MAX_ADDED`]).
    added_waiting: VecDeque<Duration>,
}

impl<J> HttpPool<J> {
    /// The pool llama-server starts with `slots` slots on a machine of
    /// `cores` cores (when the scenario says; else as many first threads
    /// as the slots ask), `crowded` when its compute threads and accept
    /// loop fill those cores.
    pub(super) fn new(slots: u32, cores: Option<u32>, crowded: bool) -> Self {
        let first = slots.saturating_add(4).max(cores.unwrap_or(0).saturating_sub(1));
        HttpPool {
            most: first.saturating_add(MAX_ADDED),
            crowded,
            state: Mutex::new(State {
                jobs: VecDeque::new(),
                threads: first,
                idle: first,
                first_waiting: first,
                added_waiting: VecDeque::new(),
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
        // One waiting thread is told, a first one while any waits (an
        // added one is left to end); with none (every idle one told
        // already), the job waits for one of them to run.
        let thread = st.tell()?;
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
            match thread {
                Thread::First => self.first_waiting += 1,
                Thread::Added => self.added_waiting.push_back(now),
            }
        }
        job
    }

    /// Takes a waiting thread to tell of a job, if one waits untold.
    fn tell(&mut self) -> Option<Thread> {
        if self.first_waiting > 0 {
            self.first_waiting -= 1;
            return Some(Thread::First);
        }
        self.added_waiting.pop_front().map(|_| Thread::Added)
    }

    /// Ends the added threads that have waited [`ADDED_IDLE`] by `now`.
    fn expire(&mut self, now: Duration) {
        while self
            .added_waiting
            .front()
            .is_some_and(|since| now.saturating_sub(*since) >= ADDED_IDLE)
        {
            self.added_waiting.pop_front();
            self.threads = self.threads.saturating_sub(1);
            self.idle = self.idle.saturating_sub(1);
        }
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
        let pool = HttpPool::new(2, Some(2), true);
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
        let pool = HttpPool::new(2, Some(2), true);
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
        let pool = HttpPool::new(2, Some(16), false);
        let started = burst(&pool, 0, 40, true, T0);
        assert_eq!(pool.queued(), 0);
        assert!(started.iter().all(Option::is_some));
        assert_eq!(pool.threads(T0), 40, "15 first threads (cores - 1), 25 added");
    }

    /// An added thread ends after 3 s idle; a first one never does.
    #[test]
    fn an_added_thread_ends_after_3_s_without_a_job() {
        let pool = HttpPool::new(1, None, false);
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

    /// A told thread that finds the jobs taken waits again, idle: the
    /// next connection goes to it, and no thread is added.
    #[test]
    fn a_told_thread_that_finds_no_job_waits_again() {
        let pool = HttpPool::new(2, Some(2), true);
        // Five of the six first threads serve a connection each.
        assert!(
            burst(&pool, 0, 5, false, T0)
                .iter()
                .all(|s| matches!(s, Some(Start::Serve(Thread::First, _))))
        );
        assert_eq!(pool.accept(5, true, T0), Some(Start::Woken(Thread::First)));
        // Before it runs, a thread whose connection closed takes the job.
        assert_eq!(pool.finished(Thread::First, T0), Some(5));
        assert_eq!(pool.woke(Thread::First, T0 + WOKEN_AFTER), None);
        // It counts idle again: the next connection is its, not an added
        // thread's.
        assert_eq!(pool.accept(6, false, T0), Some(Start::Serve(Thread::First, 6)));
        assert_eq!(pool.threads(T0), 6);
    }

    /// A pool of a scenario's many slots is a count, not a thread each.
    #[test]
    fn a_pool_of_a_billion_first_threads_is_a_count() {
        let pool = HttpPool::new(u32::MAX, None, true);
        assert_eq!(pool.threads(T0), u32::MAX);
        assert_eq!(pool.accept(0, true, T0), Some(Start::Woken(Thread::First)));
    }
}
