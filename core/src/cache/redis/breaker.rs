//! The breaker's capabilities on Redis: each transition (cooldowns
//! included) and each read as one script over the breaker's seven keys. The
//! step script is `decide::breaker::step` written in Lua, so each reply is
//! checked against the Rust function on the values the script read, and a
//! disagreement is a protocol error rather than a silent drift.

use super::error::unexpected;
#[cfg(feature = "redis-cluster")]
use super::keys::cross_slot;
use super::scripts::SCRIPTS;
use super::{RedisCache, duration_us, micros, ttl_ms};
use crate::cache::BreakerStore;
use crate::decide::breaker::{
    self as machine, BreakerCommand, BreakerKeys, BreakerParams, BreakerSnapshot, BreakerStep, CircuitState,
    FailuresWrite, Origin, Permit, ProbeId, Write, Writes,
};
use crate::error::CacheError;
use crate::time::Timestamp;

/// How the scripts spell a key holding another type than a string
/// (`common.lua`'s `read_string`), followed by the type.
const WRONG_TYPE_MARKER: &str = "WRONGTYPE: ";

impl RedisCache {
    /// On a cluster, refuses a script whose keys hash to different slots
    /// (Redis would answer `CROSSSLOT`, a bug in the keys, not an outage).
    fn one_slot(&self, operation: &'static str, keys: &BreakerKeys) -> Result<(), CacheError> {
        #[cfg(feature = "redis-cluster")]
        if self.connection()?.is_cluster()
            && let Some((a, b)) = cross_slot(&keys.all())
        {
            return Err(CacheError::Protocol {
                operation,
                detail: format!(
                    "keys {a:?} and {b:?} hash to different cluster slots; one script's keys must share a hash tag such as `{{prefix}}`"
                ),
            });
        }
        let _ = (operation, keys);
        Ok(())
    }

    /// Reports breaker keys a foreign writer gave another type than a string
    /// (the scripts read them as [`WRONG_TYPE_MARKER`] text); the state key's
    /// is also reported by the breaker as an unreadable state.
    fn report_wrong_types(&self, keys: &BreakerKeys, raw: [&Option<String>; 7]) {
        let names = keys.all();
        for (key, value) in names.into_iter().zip(raw) {
            if let Some(value) = value.as_deref().filter(|v| v.starts_with(WRONG_TYPE_MARKER)) {
                tracing::warn!(
                    server = %self.inner.target,
                    key = %key,
                    found = value,
                    "a breaker key holds another type; read as unreadable until the next write replaces it"
                );
            }
        }
    }
}

/// The script's spelling of a command: the command, the report's origin, and
/// the probe it names (empty where none).
fn command_args(command: BreakerCommand) -> [String; 4] {
    let origin = |o: Origin| match o {
        Origin::Untracked => ["untracked".to_owned(), String::new(), String::new()],
        Origin::Call => ["call".to_owned(), String::new(), String::new()],
        Origin::Probe(id) => probe_args("probe", id),
    };
    let [name, rest @ ..] = match command {
        BreakerCommand::Allow => ["allow", "", "", ""].map(str::to_owned),
        BreakerCommand::Reset => ["reset", "", "", ""].map(str::to_owned),
        BreakerCommand::CoolDown { .. } => ["cooldown", "", "", ""].map(str::to_owned),
        BreakerCommand::RecordSuccess(o) => {
            let [a, b, c] = origin(o);
            ["success".to_owned(), a, b, c]
        }
        BreakerCommand::RecordFailure(o) => {
            let [a, b, c] = origin(o);
            ["failure".to_owned(), a, b, c]
        }
        BreakerCommand::Release(id) => {
            let [a, b, c] = probe_args("probe", id);
            ["release".to_owned(), a, b, c]
        }
    };
    let [a, b, c] = rest;
    [name, a, b, c]
}

fn probe_args(origin: &str, id: ProbeId) -> [String; 3] {
    [
        origin.to_owned(),
        id.episode.as_micros().to_string(),
        id.seq.to_string(),
    ]
}

/// The script's spelling of a step's permit.
fn permit_as_script(permit: Option<Permit>) -> String {
    match permit {
        None => "-".to_owned(),
        Some(Permit::Call) => "call".to_owned(),
        Some(Permit::Probe(id)) => format!("probe:{}:{}", id.episode.as_micros(), id.seq),
        Some(Permit::Refused {
            state,
            retry_after,
            reason,
        }) => {
            format!(
                "refused:{}:{}:{}",
                state.as_str(),
                duration_us(retry_after),
                reason.as_str()
            )
        }
    }
}

/// The script's spelling of the writes, to compare with `machine::step`'s.
fn writes_as_script(w: &Writes) -> [String; 7] {
    let plain = |w: Write<String>| match w {
        Write::Keep => "keep".to_owned(),
        Write::Delete => "delete".to_owned(),
        Write::Set(s) => s,
    };
    let state = match w.state {
        Write::Keep => Write::Keep,
        Write::Delete => Write::Delete,
        Write::Set(s) => Write::Set(s.as_str().to_owned()),
    };
    let opened = match w.opened_at {
        Write::Keep => Write::Keep,
        Write::Delete => Write::Delete,
        Write::Set(t) => Write::Set(t.as_micros().to_string()),
    };
    let probes = match &w.probes {
        Write::Keep => Write::Keep,
        Write::Delete => Write::Delete,
        Write::Set(leases) => Write::Set(leases.encode()),
    };
    let failures = match w.failures {
        FailuresWrite::Keep => "keep".to_owned(),
        FailuresWrite::Create => "create".to_owned(),
        FailuresWrite::Bump(n) => n.to_string(),
        FailuresWrite::Delete => "delete".to_owned(),
    };
    let cooldown = match w.cooldown_until {
        Write::Keep => Write::Keep,
        Write::Delete => Write::Delete,
        Write::Set(t) => Write::Set(t.as_micros().to_string()),
    };
    let openings = match w.openings {
        Write::Keep => Write::Keep,
        Write::Delete => Write::Delete,
        Write::Set(n) => Write::Set(n.to_string()),
    };
    let closed_at = match w.closed_at {
        Write::Keep => Write::Keep,
        Write::Delete => Write::Delete,
        Write::Set(t) => Write::Set(t.as_micros().to_string()),
    };
    [
        plain(state),
        failures,
        plain(opened),
        plain(probes),
        plain(cooldown),
        plain(openings),
        plain(closed_at),
    ]
}

/// The cooldown a command asks for, in µs (`0` for every other command).
fn cooldown_arg(command: BreakerCommand) -> u64 {
    match command {
        BreakerCommand::CoolDown { duration } => duration_us(duration),
        _ => 0,
    }
}

impl BreakerStore for RedisCache {
    async fn breaker_step(
        &self,
        keys: &BreakerKeys,
        command: BreakerCommand,
        params: BreakerParams,
        now: Timestamp,
    ) -> Result<BreakerStep, CacheError> {
        const OP: &str = "breaker_step";
        self.one_slot(OP, keys)?;
        let now = self.now_arg(OP, now)?;
        let [name, origin, episode, seq] = command_args(command);
        let reply: Vec<Option<String>> = self
            .run(OP, |mut c| async move {
                SCRIPTS
                    .breaker_step
                    .key(&keys.state)
                    .key(&keys.failures)
                    .key(&keys.opened_at)
                    .key(&keys.probes)
                    .key(&keys.cooldown_until)
                    .key(&keys.openings)
                    .key(&keys.closed_at)
                    .arg(&name)
                    .arg(&origin)
                    .arg(&episode)
                    .arg(&seq)
                    .arg(&now)
                    .arg(params.failure_threshold)
                    .arg(duration_us(params.recovery_timeout))
                    .arg(ttl_ms(params.recovery_timeout))
                    .arg(params.half_open_max_calls)
                    .arg(duration_us(params.probe_lease))
                    .arg(cooldown_arg(command))
                    .arg(duration_us(params.max_recovery_timeout))
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        let [
            Some(before),
            Some(after),
            Some(permit),
            Some(at),
            Some(expired),
            Some(w_state),
            Some(w_failures),
            Some(w_opened),
            Some(w_probes),
            Some(w_cooldown),
            Some(w_openings),
            Some(w_closed_at),
            raw_state,
            raw_failures,
            raw_opened,
            raw_probes,
            raw_cooldown,
            raw_openings,
            raw_closed_at,
        ] = <[Option<String>; 19]>::try_from(reply.clone()).map_err(|_| unexpected(OP, &reply))?
        else {
            return Err(unexpected(OP, &reply));
        };
        let at = micros(OP, &at)?;
        let raw = [
            &raw_state,
            &raw_failures,
            &raw_opened,
            &raw_probes,
            &raw_cooldown,
            &raw_openings,
            &raw_closed_at,
        ];
        self.report_wrong_types(keys, raw);
        let snapshot = BreakerSnapshot::decode(raw.map(Option::as_deref));
        // The script is machine::step in Lua; machine::step stays the
        // definition. Re-run it on what the script read and insist they agree.
        let step = machine::step(&snapshot, command, &params, at);
        let script_says = (
            CircuitState::parse(&before),
            CircuitState::parse(&after),
            permit,
            expired,
            [
                w_state,
                w_failures,
                w_opened,
                w_probes,
                w_cooldown,
                w_openings,
                w_closed_at,
            ],
        );
        let machine_says = (
            Some(step.before),
            Some(step.after),
            permit_as_script(step.permit),
            step.expired_probes.to_string(),
            writes_as_script(&step.writes),
        );
        if script_says != machine_says {
            return Err(CacheError::Protocol {
                operation: OP,
                detail: format!(
                    "breaker script decided {script_says:?} but machine::step decides {machine_says:?} for {snapshot:?}"
                ),
            });
        }
        Ok(step)
    }

    async fn breaker_read(
        &self,
        keys: &BreakerKeys,
        now: Timestamp,
    ) -> Result<(BreakerSnapshot, Timestamp), CacheError> {
        const OP: &str = "breaker_read";
        self.one_slot(OP, keys)?;
        let now = self.now_arg(OP, now)?;
        let reply: Vec<Option<String>> = self
            .run(OP, |mut c| async move {
                SCRIPTS
                    .breaker_read
                    .key(&keys.state)
                    .key(&keys.failures)
                    .key(&keys.opened_at)
                    .key(&keys.probes)
                    .key(&keys.cooldown_until)
                    .key(&keys.openings)
                    .key(&keys.closed_at)
                    .arg(&now)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        match reply.as_slice() {
            [
                Some(at),
                state,
                failures,
                opened_at,
                probes,
                cooldown,
                openings,
                closed_at,
            ] => Ok({
                let raw = [state, failures, opened_at, probes, cooldown, openings, closed_at];
                self.report_wrong_types(keys, raw);
                (BreakerSnapshot::decode(raw.map(Option::as_deref)), micros(OP, at)?)
            }),
            _ => Err(unexpected(OP, &reply)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn every_write_has_a_script_spelling() {
        let w = Writes {
            state: Write::Set(CircuitState::HalfOpen),
            failures: FailuresWrite::Bump(3),
            opened_at: Write::Set(Timestamp::from_micros(12)),
            probes: Write::Delete,
            cooldown_until: Write::Set(Timestamp::from_micros(40)),
            openings: Write::Set(2),
            closed_at: Write::Set(Timestamp::from_micros(9)),
        };
        assert_eq!(writes_as_script(&w), ["half_open", "3", "12", "delete", "40", "2", "9"]);
        let id = ProbeId {
            episode: Timestamp::from_micros(7),
            seq: 2,
        };
        assert_eq!(permit_as_script(Some(Permit::Probe(id))), "probe:7:2");
        assert_eq!(
            command_args(BreakerCommand::RecordFailure(Origin::Probe(id))),
            ["failure", "probe", "7", "2"]
        );
        assert_eq!(command_args(BreakerCommand::Allow), ["allow", "", "", ""]);
        assert_eq!(
            writes_as_script(&Writes::NONE),
            ["keep", "keep", "keep", "keep", "keep", "keep", "keep"]
        );
        let cool = BreakerCommand::CoolDown {
            duration: Duration::from_millis(1500),
        };
        assert_eq!(command_args(cool), ["cooldown", "", "", ""]);
        assert_eq!(cooldown_arg(cool), 1_500_000);
        assert_eq!(cooldown_arg(BreakerCommand::Allow), 0);
        let refused = Permit::Refused {
            state: CircuitState::Closed,
            retry_after: Duration::from_micros(5),
            reason: crate::decide::breaker::Refusal::Cooldown,
        };
        assert_eq!(permit_as_script(Some(refused)), "refused:closed:5:cooldown");
    }
}
