//! The limiter's capabilities on Redis: the hit window, the atomic
//! check-and-record of a slot, tokens beside requests, and the calls in
//! flight a router picks by. Each is one script over keys in one slot, so a
//! fleet's decisions are as exact as one process's.

use std::time::Duration;

use super::error::unexpected;
#[cfg(feature = "redis-cluster")]
use super::keys::cross_slot;
use super::keys::{in_flight_key, tokens_key, window_key};
use super::scripts::SCRIPTS;
use super::{RedisCache, duration_us, exact, micros, ttl_ms};
use crate::cache::{HitWindow, InFlightStore, LimiterStore, SlotRequest, TokenStore};
use crate::decide::concurrency::{ConcurrencyCommand, ConcurrencyParams, ConcurrencyStep};
use crate::decide::pick::{Pick, PickRequest, check_pick};
use crate::decide::tokens::{RefusedBy, ReservationId, TokenAsk, TokenOutcome};
use crate::decide::window::SlotOutcome;
use crate::error::CacheError;
use crate::time::Timestamp;

impl RedisCache {
    /// Reports a hit window a script found holding a foreign value (another
    /// type, or scores beyond any the adapter writes) and replaced.
    fn report_healed_window(&self, key: &str, healed: bool) {
        if healed {
            tracing::warn!(
                server = %self.inner.target,
                key,
                window = %window_key(key),
                "a foreign value at a hit window was removed before recording"
            );
        }
    }
}

impl HitWindow for RedisCache {
    async fn record_hit(&self, key: &str, at: Timestamp, ttl: Duration) -> Result<(), CacheError> {
        let window = window_key(key);
        let at = exact("record_hit", at.as_micros())?;
        let healed: i64 = self
            .run("record_hit", |mut c| async move {
                SCRIPTS
                    .record_hit
                    .key(&window)
                    .arg(at)
                    .arg(duration_us(ttl))
                    .arg(ttl_ms(ttl))
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        self.report_healed_window(key, healed == 1);
        Ok(())
    }

    async fn count_since(&self, key: &str, since: Timestamp) -> Result<u64, CacheError> {
        let window = window_key(key);
        let since = exact("count_since", since.as_micros())?;
        self.run("count_since", |mut c| async move {
            SCRIPTS.count_since.key(&window).arg(since).invoke_async(&mut c).await
        })
        .await
    }

    async fn oldest_since(&self, key: &str, since: Timestamp) -> Result<Option<Timestamp>, CacheError> {
        let window = window_key(key);
        let since = exact("oldest_since", since.as_micros())?;
        let reply: Option<String> = self
            .run("oldest_since", |mut c| async move {
                SCRIPTS.oldest_since.key(&window).arg(since).invoke_async(&mut c).await
            })
            .await?;
        reply.map(|s| micros("oldest_since", &s)).transpose()
    }
}

impl LimiterStore for RedisCache {
    async fn acquire_slot(&self, key: &str, request: SlotRequest) -> Result<SlotOutcome, CacheError> {
        let window = window_key(key);
        let now = self.now_arg("acquire_slot", request.now)?;
        let reply: Vec<i64> = self
            .run("acquire_slot", |mut c| async move {
                SCRIPTS
                    .acquire_slot
                    .key(&window)
                    .arg(&now)
                    .arg(duration_us(request.window))
                    .arg(request.limit)
                    .arg(duration_us(request.ttl))
                    .arg(ttl_ms(request.ttl))
                    .arg(duration_us(request.max_ahead))
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        let stamp = |n: i64| u64::try_from(n).map(Timestamp::from_micros).ok();
        let outcome = match *reply.as_slice() {
            [1, remaining, at, clamped @ (0 | 1), healed @ (0 | 1)] => {
                self.report_healed_window(key, healed == 1);
                u32::try_from(remaining)
                    .ok()
                    .zip(stamp(at))
                    .map(|(remaining, at)| SlotOutcome::Admitted {
                        remaining,
                        at,
                        clamped: clamped == 1,
                    })
            }
            [0, used, retry, at, clamped @ (0 | 1), healed @ (0 | 1)] => {
                self.report_healed_window(key, healed == 1);
                u64::try_from(used)
                    .ok()
                    .zip(u64::try_from(retry).ok())
                    .zip(stamp(at))
                    .map(|((used, retry), at)| SlotOutcome::Refused {
                        used,
                        retry_after: Duration::from_micros(retry),
                        at,
                        clamped: clamped == 1,
                    })
            }
            _ => None,
        };
        outcome.ok_or_else(|| unexpected("acquire_slot", &reply))
    }

    #[cfg(feature = "mutants")]
    fn hit_window(&self) -> Option<&impl HitWindow> {
        Some(self)
    }
}

impl InFlightStore for RedisCache {
    async fn pick_least_loaded(
        &self,
        keys: &[&str],
        weights: &[u32],
        request: PickRequest,
    ) -> Result<Pick, CacheError> {
        check_pick(keys, weights)?;
        let sets: Vec<String> = keys.iter().map(|k| in_flight_key(k)).collect();
        #[cfg(feature = "redis-cluster")]
        if self.connection()?.is_cluster() {
            let names: Vec<&str> = sets.iter().map(String::as_str).collect();
            if let Some((a, b)) = cross_slot(&names) {
                return Err(CacheError::Protocol {
                    operation: "pick_least_loaded",
                    detail: format!(
                        "keys {a:?} and {b:?} hash to different cluster slots; a router's keys must share a hash tag such as `{{prefix}}`"
                    ),
                });
            }
        }
        let now = self.now_arg("pick_least_loaded", request.now)?;
        let reply: Vec<i64> = self
            .run("pick_least_loaded", |mut c| async move {
                let mut call = SCRIPTS.pick_least_loaded.prepare_invoke();
                for set in &sets {
                    call.key(set);
                }
                call.arg(&now)
                    .arg(request.id)
                    .arg(duration_us(request.lease))
                    .arg(ttl_ms(request.lease))
                    .arg(duration_us(request.max_ahead));
                for w in weights {
                    call.arg(*w);
                }
                call.invoke_async(&mut c).await
            })
            .await?;
        let pick = match reply.split_first() {
            Some((&index, counts)) if counts.len() == keys.len() => usize::try_from(index)
                .ok()
                .filter(|i| *i < keys.len())
                .zip(
                    counts
                        .iter()
                        .map(|c| u64::try_from(*c).ok())
                        .collect::<Option<Vec<u64>>>(),
                )
                .map(|(index, counts)| Pick { index, counts }),
            _ => None,
        };
        pick.ok_or_else(|| unexpected("pick_least_loaded", &reply))
    }

    async fn end_in_flight(&self, key: &str, id: u64) -> Result<(), CacheError> {
        let set = in_flight_key(key);
        self.run("end_in_flight", |mut c| async move {
            ::redis::cmd("ZREM").arg(&set).arg(id).query_async::<()>(&mut c).await
        })
        .await
    }

    async fn concurrency_step(
        &self,
        key: &str,
        command: ConcurrencyCommand,
        params: ConcurrencyParams,
        request: PickRequest,
    ) -> Result<ConcurrencyStep, CacheError> {
        self.step_concurrency(key, command, params, request).await
    }
}

impl TokenStore for RedisCache {
    async fn acquire_with_tokens(
        &self,
        key: &str,
        request: SlotRequest,
        ask: TokenAsk,
    ) -> Result<TokenOutcome, CacheError> {
        let window = window_key(key);
        let ledger = tokens_key(key);
        #[cfg(feature = "redis-cluster")]
        if self.connection()?.is_cluster()
            && let Some((a, b)) = cross_slot(&[&window, &ledger])
        {
            return Err(CacheError::Protocol {
                operation: "acquire_with_tokens",
                detail: format!(
                    "keys {a:?} and {b:?} hash to different cluster slots; a key with a `}}` must carry a hash tag such as `{{prefix}}`"
                ),
            });
        }
        let now = self.now_arg("acquire_with_tokens", request.now)?;
        let tokens = exact("acquire_with_tokens", ask.tokens)?;
        let limit = exact("acquire_with_tokens", ask.limit)?;
        let reply: Vec<i64> = self
            .run("acquire_with_tokens", |mut c| async move {
                SCRIPTS
                    .acquire_with_tokens
                    .key(&window)
                    .key(&ledger)
                    .arg(&now)
                    .arg(duration_us(request.window))
                    .arg(request.limit)
                    .arg(duration_us(request.ttl))
                    .arg(ttl_ms(request.ttl))
                    .arg(duration_us(request.max_ahead))
                    .arg(tokens)
                    .arg(limit)
                    .arg(duration_us(ask.lease))
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        let n = |v: i64| u64::try_from(v).ok();
        let outcome = match *reply.as_slice() {
            [1, remaining, used, at, seq, clamped @ (0 | 1), healed @ (0 | 1)] => {
                self.report_healed_window(key, healed == 1);
                match (u32::try_from(remaining), n(used), n(at), u32::try_from(seq)) {
                    (Ok(remaining), Some(used), Some(at), Ok(seq)) => Some(TokenOutcome::Admitted {
                        remaining,
                        tokens_used: used,
                        reservation: ReservationId {
                            at: Timestamp::from_micros(at),
                            seq,
                        },
                        clamped: clamped == 1,
                    }),
                    _ => None,
                }
            }
            [0, by, requests, used, wait, at, clamped @ (0 | 1), healed @ (0 | 1)] => {
                self.report_healed_window(key, healed == 1);
                let by = match by {
                    1 => Some(RefusedBy::Requests),
                    2 => Some(RefusedBy::Tokens),
                    3 => Some(RefusedBy::Both),
                    4 => Some(RefusedBy::TooLarge),
                    _ => None,
                };
                match (by, n(requests), n(used), n(wait), n(at)) {
                    (Some(by), Some(requests), Some(used), Some(wait), Some(at)) => Some(TokenOutcome::Refused {
                        by,
                        requests_used: requests,
                        tokens_used: used,
                        retry_after: Duration::from_micros(wait),
                        at: Timestamp::from_micros(at),
                        clamped: clamped == 1,
                    }),
                    _ => None,
                }
            }
            _ => None,
        };
        outcome.ok_or_else(|| unexpected("acquire_with_tokens", &reply))
    }

    async fn settle_tokens(&self, key: &str, id: ReservationId, actual: u64) -> Result<bool, CacheError> {
        let ledger = tokens_key(key);
        let at = exact("settle_tokens", id.at.as_micros())?;
        let actual = exact("settle_tokens", actual)?;
        let found: i64 = self
            .run("settle_tokens", |mut c| async move {
                SCRIPTS
                    .settle_tokens
                    .key(&ledger)
                    .arg(at)
                    .arg(id.seq)
                    .arg(actual)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        match found {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(unexpected("settle_tokens", &other)),
        }
    }
}
