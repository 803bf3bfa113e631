//! What the workspace's tests share and that needs nothing of redstring's:
//! processes and servers to test against, and small fixtures.
//!
//! - [`redis`]: private `redis-server` processes — one on a unix socket, a
//!   TLS-only one, a 3-primary Cluster (plain or TLS) shared by a test
//!   binary, and a primary, replica and Sentinel — all built on one
//!   argument list ([`redis::base_command`]).
//! - [`http`]: a scripted OpenAI-compatible HTTP server (hyper on tokio)
//!   that answers from a queue and records every request.
//! - [`ready`]: polls a future once, for in-process stores that never suspend.
//! - [`temp_file`]: a file in a temporary directory of this process.
//!
//! Architecture invariant: this crate does not depend on `redstring`. The
//! core's tests use it as a dev-dependency; if it depended on the core, their
//! binary would link two copies of `redstring` whose types do not match.
//! Helpers that need redstring's types (a `RedisCache` for a topology, the
//! compliance harness) live in each crate's `tests/it/support`.

pub mod http;
pub mod redis;

use std::future::Future;
use std::path::PathBuf;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// Polls `f` once and returns its output; panics if it is not ready.
///
/// For futures that never suspend — every operation of an in-process store —
/// driven without a runtime, so a test or bench measures the operation and
/// nothing else.
pub fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the future suspended: in-process operations never do"),
    }
}

/// Writes `text` to `name` (which may name subdirectories) in a temporary
/// directory of this process and of the calling source file, and returns
/// its path.
///
/// Each calling file gets its own directory, so the modules of one test
/// binary may use the same names without writing over each other's files.
#[track_caller]
pub fn temp_file(name: &str, text: &str) -> PathBuf {
    let caller = std::panic::Location::caller().file();
    let module = std::path::Path::new(caller)
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("test");
    let dir = std::env::temp_dir()
        .join(format!("redstring-test-{}", std::process::id()))
        .join(module);
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap_or(&dir)).expect("create the temporary directory");
    std::fs::write(&path, text).expect("write the temporary file");
    path
}
