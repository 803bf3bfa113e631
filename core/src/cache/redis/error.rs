//! What an error from the redis crate means for the port — unavailable
//! (transient, so the components' cache-unavailable policies apply), a
//! refused password (a misconfiguration), or a protocol error (a bug or a
//! foreign writer) — and the redaction that keeps a password out of every
//! error, log line and `Debug` output the adapter produces.

use ::redis::{ConnectionAddr, ConnectionInfo, ErrorKind, RedisError, ServerErrorKind};

use super::RedisCache;
use crate::error::CacheError;

impl RedisCache {
    /// `error` in the port's vocabulary, naming the server (redacted) and
    /// with the password scrubbed from the redis crate's text.
    pub(super) fn map_error(&self, operation: &'static str, error: &RedisError) -> CacheError {
        let text = scrub(&error.to_string(), self.inner.secret.as_deref());
        match classify(error) {
            Class::Authentication => CacheError::Authentication {
                operation,
                target: self.inner.target.clone(),
            },
            Class::Unavailable(None) => CacheError::Unavailable {
                operation,
                reason: format!("{}: {text}", self.inner.target),
            },
            Class::Unavailable(Some(code)) => CacheError::Unavailable {
                operation,
                reason: format!("{} answered {code}: {text}", self.inner.target),
            },
            Class::Protocol => CacheError::Protocol {
                operation,
                detail: text,
            },
        }
    }
}

/// Server error codes meaning "the server cannot serve this now", which the
/// components' cache-unavailable policies cover: out of memory under
/// `noeviction`, loading its dataset, busy with a long script, a replica
/// refusing writes after a failover, a replica whose master is down, a
/// cluster that is down or resharding.
const UNAVAILABLE_CODES: [&str; 7] = [
    "OOM",
    "LOADING",
    "BUSY",
    "READONLY",
    "MASTERDOWN",
    "CLUSTERDOWN",
    "TRYAGAIN",
];

/// Server error codes meaning the credentials were refused.
const AUTHENTICATION_CODES: [&str; 2] = ["NOAUTH", "WRONGPASS"];

/// What an error from the redis crate means for the port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// A wrong or missing password: a misconfiguration.
    Authentication,
    /// The server could not answer now (transient); with the server's error
    /// code when it said so itself.
    Unavailable(Option<&'static str>),
    /// A bug or a foreign writer.
    Protocol,
}

fn classify(error: &RedisError) -> Class {
    let text = error.to_string();
    if matches!(error.kind(), ErrorKind::AuthenticationFailed)
        || error_codes(error, &text).any(|code| AUTHENTICATION_CODES.contains(&code))
        || text.contains("called without any password configured")
    {
        return Class::Authentication;
    }
    if let Some(code) = error_codes(error, &text).find_map(|c| UNAVAILABLE_CODES.iter().find(|&&u| u == c)) {
        return Class::Unavailable(Some(code));
    }
    if error.is_io_error()
        || error.is_timeout()
        || error.is_connection_refusal()
        || error.is_connection_dropped()
        || matches!(
            error.kind(),
            ErrorKind::Io
                | ErrorKind::ClusterConnectionNotFound
                | ErrorKind::MasterNameNotFoundBySentinel
                | ErrorKind::NoValidReplicasFoundBySentinel
                | ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                )
        )
    {
        return Class::Unavailable(None);
    }
    Class::Protocol
}

/// The error codes an error carries: the reply's own code, and any code
/// quoted in its text. A `redis.call` failing inside a script reaches the
/// client with the inner error's code (Redis 7: `-OOM … script: …`) or, on
/// older servers, wrapped in an `ERR Error running script … -OOM …` whose
/// text still names it; either way the code is an upper-case word of the
/// text.
fn error_codes<'a>(error: &'a RedisError, text: &'a str) -> impl Iterator<Item = &'a str> {
    let words = text
        .split(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
        .filter(|w| w.len() >= 2);
    error.code().into_iter().chain(words)
}

pub(super) fn unexpected(operation: &'static str, reply: &impl std::fmt::Debug) -> CacheError {
    CacheError::Protocol {
        operation,
        detail: format!("unexpected script reply {reply:?}"),
    }
}

/// A printable form of the server: scheme, user, host and db, password `***`.
pub(super) fn describe(info: &ConnectionInfo) -> String {
    let settings = info.redis_settings();
    let user = settings.username().unwrap_or("");
    let password = if settings.password().is_some() { ":***" } else { "" };
    let auth = if user.is_empty() && password.is_empty() {
        String::new()
    } else {
        format!("{user}{password}@")
    };
    match info.addr() {
        ConnectionAddr::Tcp(host, port) => format!("redis://{auth}{host}:{port}/{}", settings.db()),
        ConnectionAddr::TcpTls { host, port, .. } => format!("rediss://{auth}{host}:{port}/{}", settings.db()),
        ConnectionAddr::Unix(path) => {
            let pass = if settings.password().is_some() { "&pass=***" } else { "" };
            format!("unix://{}?db={}{pass}", path.display(), settings.db())
        }
        other => format!("{other}"),
    }
}

/// A URL that did not parse, with anything that may be a password hidden:
/// the userinfo before `@`, and any query string.
pub(super) fn redact_raw(url: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((head, _)) => (head, "?***"),
        None => (url, ""),
    };
    let shown = match (head.find("://"), head.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://***@{}", &head[..scheme_end], &head[at + 1..])
        }
        (_, Some(at)) => format!("***@{}", &head[at + 1..]),
        (_, None) => head.to_owned(),
    };
    format!("{shown}{query}")
}

/// `text` with every occurrence of `secret` replaced by `***`.
pub(super) fn scrub(text: &str, secret: Option<&str>) -> String {
    match secret {
        Some(secret) if !secret.is_empty() => text.replace(secret, "***"),
        _ => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unparseable_urls_hide_their_userinfo_and_query() {
        assert_eq!(redact_raw("bogus://user:hunter2@host:1"), "bogus://***@host:1");
        assert_eq!(redact_raw("unix:///tmp/s?pass=hunter2"), "unix:///tmp/s?***");
        assert_eq!(redact_raw("nonsense"), "nonsense");
        assert_eq!(redact_raw("user:hunter2@host"), "***@host");
        assert_eq!(redact_raw("x://a@b?pass=hunter2"), "x://***@b?***");
    }

    /// The error the redis crate makes of a raw RESP error reply.
    fn server_error(reply: &str) -> RedisError {
        match ::redis::parse_redis_value(format!("{reply}\r\n").as_bytes()) {
            Ok(::redis::Value::ServerError(e)) => e.into(),
            other => panic!("{reply} parsed as {other:?}"),
        }
    }

    #[test]
    fn server_errors_that_mean_unavailable_are_classified_by_code() {
        for (reply, code) in [
            ("-OOM command not allowed when used memory > 'maxmemory'.", "OOM"),
            ("-LOADING Redis is loading the dataset in memory", "LOADING"),
            ("-BUSY Redis is busy running a script.", "BUSY"),
            ("-READONLY You can't write against a read only replica.", "READONLY"),
            ("-MASTERDOWN Link with MASTER is down", "MASTERDOWN"),
            ("-CLUSTERDOWN The cluster is down", "CLUSTERDOWN"),
            ("-TRYAGAIN Multiple keys request during rehashing of slot", "TRYAGAIN"),
            // Redis 7: a redis.call inside a script keeps its code.
            (
                "-OOM command not allowed when used memory > 'maxmemory'. script: 37df, on @user_script:1.",
                "OOM",
            ),
            // Older servers wrap it in ERR; the code is still in the text.
            (
                "-ERR Error running script (call to f_37df): @user_script:1: -OOM command not allowed",
                "OOM",
            ),
        ] {
            assert_eq!(
                classify(&server_error(reply)),
                Class::Unavailable(Some(code)),
                "{reply}"
            );
        }
    }

    #[test]
    fn credentials_refused_are_authentication_and_bugs_are_protocol() {
        for reply in [
            "-NOAUTH Authentication required.",
            "-WRONGPASS invalid username-password pair or user is disabled.",
            "-ERR AUTH <password> called without any password configured for the default user.",
        ] {
            assert_eq!(classify(&server_error(reply)), Class::Authentication, "{reply}");
        }
        for reply in [
            "-ERR unknown command 'FOO'",
            "-WRONGTYPE Operation against a key holding the wrong kind of value",
            "-ERR Error running script: @user_script:3: attempt to compare nil with number",
            "-NOPERM this user has no permissions to run the 'evalsha' command",
            // A cluster client follows redirects itself; one reaching the
            // adapter, or keys spanning slots, is a bug.
            "-MOVED 3999 127.0.0.1:6381",
            "-CROSSSLOT Keys in request don't hash to the same slot",
        ] {
            assert_eq!(classify(&server_error(reply)), Class::Protocol, "{reply}");
        }
    }

    #[test]
    fn a_sentinel_without_a_primary_to_name_is_unavailable() {
        for kind in [
            ErrorKind::MasterNameNotFoundBySentinel,
            ErrorKind::NoValidReplicasFoundBySentinel,
            ErrorKind::ClusterConnectionNotFound,
        ] {
            let error = RedisError::from((kind, "no primary now"));
            assert_eq!(classify(&error), Class::Unavailable(None), "{kind:?}");
        }
    }

    #[test]
    fn scrub_replaces_the_secret() {
        assert_eq!(scrub("auth hunter2 failed", Some("hunter2")), "auth *** failed");
        assert_eq!(scrub("nothing", None), "nothing");
        assert_eq!(scrub("nothing", Some("")), "nothing");
    }
}
