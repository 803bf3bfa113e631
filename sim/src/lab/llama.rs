//! A real llama.cpp `llama-server`, as a child process the laboratory owns.
//!
//! The laboratory's claims rest on a real server, so starting one must be
//! plain and safe: the binary and the generated models are found where
//! `lab/setup.sh` puts them (or refused up front with the command that puts
//! them there), the server listens on a free loopback port only, its output
//! goes to a log whose end is quoted when it fails to come up, and dropping
//! the handle kills the process, so no server outlives its owner.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The llama-cpp-python release whose vendored llama.cpp `lab/setup.sh`
/// builds (llama.cpp 0c1e570).
pub const LLAMA_CPP_PYTHON: &str = "0.3.36";

/// The model the laboratory serves unless told otherwise: 512 dimensions,
/// 8 layers, about 3 to 15 ms a token on one core (`lab/make-model.py`).
pub const DEFAULT_MODEL: &str = "lab-512x8.gguf";

/// Why a real server could not be had.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// Something the laboratory needs is not installed.
    #[error("{what} not found at {}; run `{fix}` (see docs/lab.md)", at.display())]
    Missing {
        /// What is missing.
        what: &'static str,
        /// Where it was looked for.
        at: PathBuf,
        /// The command that provides it.
        fix: &'static str,
    },
    /// The process could not be started.
    #[error("cannot start {}: {source}", binary.display())]
    Spawn {
        /// The binary.
        binary: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Ctrl-C ended the run; every server it started was killed.
    #[error("interrupted; every server the laboratory started was stopped")]
    Interrupted,
    /// The scenario asks for what the laboratory cannot run for real.
    #[error("field `{field}` {problem}")]
    Unsupported {
        /// The field.
        field: String,
        /// Why.
        problem: String,
    },
    /// The server did not come up.
    #[error("llama-server on port {port} {problem}; the end of its log:\n{log}")]
    NotReady {
        /// Its port.
        port: u16,
        /// What happened (it exited, or it was not ready in time).
        problem: String,
        /// The last lines it printed.
        log: String,
    },
}

/// Where `lab/setup.sh` puts what the laboratory runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tools {
    /// The `llama-server` binary.
    pub llama_server: PathBuf,
    /// The directory of generated models.
    pub models: PathBuf,
}

impl Tools {
    /// The cache directory: `$REDSTRING_CACHE`, else
    /// `$XDG_CACHE_HOME/redstring`, else `~/.cache/redstring`.
    pub fn cache_dir() -> PathBuf {
        if let Some(dir) = std::env::var_os("REDSTRING_CACHE") {
            return PathBuf::from(dir);
        }
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(|| PathBuf::from(".cache"));
        base.join("redstring")
    }

    /// The binary (`$REDSTRING_LLAMA_SERVER`, else the cache's build) and
    /// the models, each checked to be there.
    pub fn find() -> Result<Tools, LabError> {
        let cache = Self::cache_dir();
        let llama_server = std::env::var_os("REDSTRING_LLAMA_SERVER").map_or_else(
            || {
                cache
                    .join(format!("llama-server-{LLAMA_CPP_PYTHON}"))
                    .join("llama-server")
            },
            PathBuf::from,
        );
        if !llama_server.is_file() {
            return Err(LabError::Missing {
                what: "llama-server",
                at: llama_server,
                fix: "lab/setup.sh",
            });
        }
        let models = cache.join("models");
        if !models.join(DEFAULT_MODEL).is_file() {
            return Err(LabError::Missing {
                what: "the laboratory's models",
                at: models,
                fix: "lab/setup.sh",
            });
        }
        Ok(Tools { llama_server, models })
    }
}

/// How to run one server.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaSpec {
    /// The model file.
    pub model: PathBuf,
    /// Decode slots (`-np`).
    pub slots: u32,
    /// Context over all slots (`-c`); a larger one takes longer to load,
    /// since the server allocates and clears its KV cache before it is
    /// ready.
    pub context: u64,
    /// Threads (`-t`): one is steadiest on a busy machine.
    pub threads: u32,
}

impl LlamaSpec {
    /// The laboratory's server: the generated [`DEFAULT_MODEL`] of `tools`
    /// on one thread, with `slots` slots sharing `context` tokens.
    pub fn lab(tools: &Tools, slots: u32, context: u64) -> LlamaSpec {
        LlamaSpec {
            model: tools.models.join(DEFAULT_MODEL),
            slots,
            context,
            threads: 1,
        }
    }
}

/// A running `llama-server`, killed when dropped.
pub struct LlamaServer {
    child: Child,
    port: u16,
    log: tempfile::NamedTempFile,
    tools: Tools,
    spec: LlamaSpec,
}

impl LlamaServer {
    /// Starts `spec` under `tools` on a free loopback port. The server binds
    /// its port at once and answers `503 Loading model` until its model is
    /// loaded: see [`LlamaServer::ready`].
    pub fn start(tools: &Tools, spec: &LlamaSpec) -> Result<LlamaServer, LabError> {
        let spawn_error = |source| LabError::Spawn {
            binary: tools.llama_server.clone(),
            source,
        };
        let port = free_port().map_err(spawn_error)?;
        let log = tempfile::NamedTempFile::new().map_err(spawn_error)?;
        let child = spawn(tools, spec, port, &log)?;
        Ok(LlamaServer {
            child,
            port,
            log,
            tools: tools.clone(),
            spec: spec.clone(),
        })
    }

    /// Kills the process if it runs and starts it again on the same port:
    /// a restart, with its load.
    pub fn restart(&mut self) -> Result<(), LabError> {
        self.kill();
        self.child = spawn(&self.tools, &self.spec, self.port, &self.log)?;
        Ok(())
    }

    /// Whether the process is still running (stopped counts as running).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Stops the process (SIGSTOP): it holds its connections and answers
    /// nothing, as a hung server does, until [`LlamaServer::resume`].
    pub fn hang(&self) -> Result<(), LabError> {
        self.signal("-STOP")
    }

    /// Lets a hung process go on (SIGCONT).
    pub fn resume(&self) -> Result<(), LabError> {
        self.signal("-CONT")
    }

    /// Sends `signal` with `kill(1)`, which every Linux has (the crate
    /// forbids the unsafe call it would otherwise take).
    fn signal(&self, signal: &str) -> Result<(), LabError> {
        let failed = |problem: String| LabError::NotReady {
            port: self.port,
            problem,
            log: String::new(),
        };
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .map_err(|e| failed(format!("could not be sent {signal}: {e}")))?;
        if status.success() {
            Ok(())
        } else {
            Err(failed(format!("could not be sent {signal}: kill exited {status}")))
        }
    }

    /// Its loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Waits until `/health` answers 200, polling every 20 ms, and says how
    /// long that took; fails when the process exits or `within` passes.
    pub async fn ready(&mut self, within: Duration) -> Result<Duration, LabError> {
        let start = tokio::time::Instant::now();
        let client = super::http_client().map_err(|e| self.not_ready(format!("cannot be asked: {e}")))?;
        let url = format!("{}/health", self.base_url());
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(self.not_ready(format!("exited ({status})")));
            }
            if healthy(&client, &url).await {
                return Ok(start.elapsed());
            }
            if start.elapsed() > within {
                return Err(self.not_ready(format!("was not ready within {within:?}")));
            }
            tokio::time::sleep(HEALTH_POLL).await;
        }
    }

    fn not_ready(&self, problem: String) -> LabError {
        LabError::NotReady {
            port: self.port,
            problem,
            log: tail(self.log.path(), 12),
        }
    }

    /// Kills the process (SIGKILL) and reaps it: a crash. Connections to
    /// its port are refused until [`LlamaServer::restart`].
    pub fn kill(&mut self) {
        // A stopped process dies of SIGKILL too.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `spec`'s server on `port`, its output appended to `log`.
fn spawn(tools: &Tools, spec: &LlamaSpec, port: u16, log: &tempfile::NamedTempFile) -> Result<Child, LabError> {
    let spawn_error = |source| LabError::Spawn {
        binary: tools.llama_server.clone(),
        source,
    };
    let out = log.reopen().map_err(spawn_error)?;
    let err = log.reopen().map_err(spawn_error)?;
    owned(&tools.llama_server)
        .arg("--model")
        .arg(&spec.model)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--parallel", &spec.slots.to_string()])
        .args(["--ctx-size", &spec.context.to_string()])
        .args(["--threads", &spec.threads.to_string()])
        .args(["--load-mode", "none"])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(spawn_error)
}

/// A command for `binary` whose process is killed when the thread that
/// starts it ends — so even a `kill -9` of the laboratory leaves no server
/// behind — through util-linux's `setpriv --pdeathsig KILL`, which sets
/// the parent-death signal and then executes `binary` in its place (the
/// crate forbids the `unsafe` the system call would take here). Without
/// `setpriv` on the `PATH`, `binary` is run plainly, and only a clean exit
/// or Ctrl-C stops it. Start the laboratory's processes from a thread that
/// lives as long as they should.
pub(crate) fn owned(binary: &Path) -> Command {
    let setpriv = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("setpriv"))
            .find(|p| p.is_file())
    });
    match setpriv {
        Some(setpriv) => {
            let mut command = Command::new(setpriv);
            command.args(["--pdeathsig", "KILL", "--"]).arg(binary);
            command
        }
        None => Command::new(binary),
    }
}

/// How often `/health` is asked while a server loads.
pub(crate) const HEALTH_POLL: Duration = Duration::from_millis(20);

/// Whether `health` (a server's `/health` URL) answers 200 within a second.
pub(crate) async fn healthy(client: &reqwest::Client, health: &str) -> bool {
    let answer = client.get(health).timeout(Duration::from_secs(1)).send().await;
    answer.is_ok_and(|r| r.status().as_u16() == 200)
}

/// A loopback port nothing listens on now.
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The last `lines` lines of the file at `path` (at most 64 KiB of it read).
fn tail(path: &Path, lines: usize) -> String {
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let len = f.metadata().map_or(0, |m| m.len());
        let _ = std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(len.saturating_sub(64 * 1024)));
        let mut bytes = Vec::new();
        let _ = f.read_to_end(&mut bytes);
        text = String::from_utf8_lossy(&bytes).into_owned();
    }
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
