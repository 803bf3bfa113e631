//! A deployment's adaptive concurrency limit on Redis: its leases and its
//! limit as one script over the limit's key and its in-flight set, decided
//! as `decide::concurrency::step` decides it in memory.

use super::error::unexpected;
#[cfg(feature = "redis-cluster")]
use super::keys::cross_slot;
use super::keys::in_flight_key;
use super::scripts::SCRIPTS;
use super::{RedisCache, duration_us, ttl_ms};
use crate::decide::concurrency::{ConcurrencyCommand, ConcurrencyParams, ConcurrencyStep};
use crate::decide::pick::PickRequest;
use crate::error::CacheError;

impl RedisCache {
    /// [`InFlightStore::concurrency_step`](crate::cache::InFlightStore::concurrency_step) on Redis.
    pub(super) async fn step_concurrency(
        &self,
        key: &str,
        command: ConcurrencyCommand,
        params: ConcurrencyParams,
        request: PickRequest,
    ) -> Result<ConcurrencyStep, CacheError> {
        let set = in_flight_key(key);
        #[cfg(feature = "redis-cluster")]
        if self.connection()?.is_cluster()
            && let Some((a, b)) = cross_slot(&[key, &set])
        {
            return Err(CacheError::Protocol {
                operation: "concurrency_step",
                detail: format!("keys {a:?} and {b:?} hash to different cluster slots"),
            });
        }
        let now = self.now_arg("concurrency_step", request.now)?;
        let reply: Vec<i64> = self
            .run("concurrency_step", |mut c| async move {
                SCRIPTS
                    .concurrency_step
                    .key(key)
                    .key(&set)
                    .arg(&now)
                    .arg(request.id)
                    .arg(duration_us(request.lease))
                    .arg(ttl_ms(request.lease).max(1))
                    .arg(duration_us(request.max_ahead))
                    .arg(command.as_str())
                    .arg(params.initial)
                    .arg(params.min)
                    .arg(params.max)
                    .arg(params.backoff)
                    .arg(ttl_ms(params.ttl).max(1))
                    .arg(params.reserve)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        let step = match *reply.as_slice() {
            [admitted @ (0 | 1), in_flight, limit, next, healed @ (0 | 1)] => u64::try_from(in_flight)
                .ok()
                .zip(u64::try_from(limit).ok())
                .zip(u64::try_from(next).ok())
                .map(|((in_flight, limit), next)| ConcurrencyStep {
                    admitted: admitted == 1,
                    in_flight,
                    limit,
                    next,
                    healed: healed == 1,
                }),
            _ => None,
        };
        let step = step.ok_or_else(|| unexpected("concurrency_step", &reply))?;
        if step.healed {
            tracing::warn!(server = %self.inner.target, key, "a foreign value at a concurrency limit was replaced");
        }
        Ok(step)
    }
}
