//! A fleet's retry budget on Redis: the bucket's refill, spend and deposit
//! as one script over the budget's key, decided as
//! `decide::budget::step` decides it in memory.

use super::error::unexpected;
use super::scripts::SCRIPTS;
use super::{RedisCache, duration_us, ttl_ms};
use crate::cache::BudgetStore;
use crate::decide::budget::{BudgetCommand, BudgetParams, BudgetState, BudgetStep};
use crate::error::CacheError;
use crate::time::Timestamp;

impl BudgetStore for RedisCache {
    async fn budget_step(
        &self,
        key: &str,
        command: BudgetCommand,
        params: BudgetParams,
        now: Timestamp,
    ) -> Result<BudgetStep, CacheError> {
        let now = self.now_arg("budget_step", now)?;
        let reply: Vec<i64> = self
            .run("budget_step", |mut c| async move {
                SCRIPTS
                    .budget_step
                    .key(key)
                    .arg(&now)
                    .arg(command.as_str())
                    .arg(params.deposit)
                    .arg(params.refill_per_sec)
                    .arg(params.max_balance)
                    .arg(ttl_ms(params.ttl))
                    .arg(duration_us(params.max_ahead))
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        let step = match *reply.as_slice() {
            [granted @ (0 | 1), balance, stamp, at, healed @ (0 | 1)] => u64::try_from(balance)
                .ok()
                .zip(u64::try_from(stamp).ok())
                .zip(u64::try_from(at).ok())
                .map(|((balance, stamp), at)| BudgetStep {
                    granted: granted == 1,
                    state: BudgetState {
                        balance,
                        stamp: Timestamp::from_micros(stamp),
                    },
                    at: Timestamp::from_micros(at),
                    healed: healed == 1,
                }),
            _ => None,
        };
        let step = step.ok_or_else(|| unexpected("budget_step", &reply))?;
        if step.healed {
            tracing::warn!(server = %self.inner.target, key, "a foreign value at a retry budget was replaced");
        }
        Ok(step)
    }
}
