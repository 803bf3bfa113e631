//! A real `redis-server`, as the shared cache of a laboratory run.
//!
//! A fleet's shared cache is a Redis the workers reach over the network;
//! the simulator models it as a cache host behind links. For the laboratory
//! to test that model, its shared cache is a real `redis-server` child
//! process on a free loopback port, without persistence, reached by each
//! worker's own `RedisCache` through its own link ([`super::links`]), so
//! `cache_down` (the process killed), `cache_up` (started again on its
//! port, empty) and partitions of a worker from the cache act on the real
//! thing. Dropping the handle kills the process, and so does the end of
//! the thread that started it (`lab::llama::owned`).

use std::io::{Read as _, Write as _};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use super::llama::LabError;

/// The `redis-server` binary: `REDSTRING_REDIS_SERVER`, or `redis-server`
/// on the `PATH`; `None` when neither is there.
pub fn binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("REDSTRING_REDIS_SERVER") {
        return Some(PathBuf::from(path));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("redis-server"))
            .find(|p| p.is_file())
    })
}

/// A running `redis-server` the laboratory owns.
pub struct RedisServer {
    binary: PathBuf,
    child: Option<Child>,
    port: u16,
}

impl RedisServer {
    /// Starts `binary` on a free loopback port and waits until it answers.
    pub fn start(binary: PathBuf) -> Result<RedisServer, LabError> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|source| LabError::Spawn {
                binary: binary.clone(),
                source,
            })?
            .port();
        let mut server = RedisServer {
            binary,
            child: None,
            port,
        };
        server.up()?;
        Ok(server)
    }

    /// Its loopback port, the same across its restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills it (SIGKILL): its state is gone and its port refuses.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on its port, empty, and waits until it answers.
    pub fn up(&mut self) -> Result<(), LabError> {
        self.kill();
        let child = super::llama::owned(&self.binary)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| LabError::Spawn {
                binary: self.binary.clone(),
                source,
            })?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.pong() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        Err(LabError::NotReady {
            port: self.port,
            problem: "(redis-server) did not answer PING within 10 s".into(),
            log: String::new(),
        })
    }

    /// Whether it answers `PING`.
    fn pong(&self) -> bool {
        let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
        let mut answer = [0u8; 7];
        stream.write_all(b"PING\r\n").is_ok() && stream.read_exact(&mut answer).is_ok() && &answer == b"+PONG\r\n"
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_killed_redis_server_refuses_and_comes_back_empty_on_its_port() {
        let Some(binary) = binary() else {
            assert!(
                std::env::var("REDSTRING_REQUIRE_REDIS").as_deref() != Ok("1"),
                "REDSTRING_REQUIRE_REDIS=1 but redis-server is not on the PATH"
            );
            eprintln!("SKIPPED: redis-server is not on the PATH");
            return;
        };
        let mut server = RedisServer::start(binary).unwrap();
        let port = server.port();
        let ask = |command: &str| -> Option<String> {
            let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
            stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
            stream.write_all(command.as_bytes()).ok()?;
            let mut answer = vec![0u8; 64];
            let n = stream.read(&mut answer).ok()?;
            Some(String::from_utf8_lossy(&answer[..n]).into_owned())
        };
        assert_eq!(ask("SET k v\r\n").as_deref(), Some("+OK\r\n"));
        server.kill();
        assert_eq!(ask("GET k\r\n"), None, "refused");
        server.up().unwrap();
        assert_eq!(server.port(), port);
        assert_eq!(ask("GET k\r\n").as_deref(), Some("$-1\r\n"), "empty");
    }
}
