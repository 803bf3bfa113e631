//! Shards: one sweep, comparison, fuzz run or tune split over several
//! machines.
//!
//! `--shard i/n` runs the seeds (or fuzz cases) whose index from the first
//! is `i − 1` modulo `n` ([`Shard::seeds`]); every result a command writes
//! under `--shard` says which shard it is, and [`crate::merge`] joins the
//! shards back into the result one machine would have given.

use serde::{Deserialize, Serialize};

/// Which of `count` shards this is (`index` from 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// From 1 to `count`.
    pub index: u64,
    /// How many shards the work is split into.
    pub count: u64,
}

/// Why shards cannot be merged, or `--shard` is not `i/n`.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ShardError {
    /// `--shard` is not `i/n` with `1 ≤ i ≤ n`.
    #[error("--shard {0:?}: expected i/n with 1 ≤ i ≤ n, e.g. 2/4")]
    Syntax(String),
    /// A file is not a shard's `--json`.
    #[error("{file}: not the --json of a sweep, compare, fuzz or tune shard: {why}")]
    NotAShard {
        /// The file.
        file: String,
        /// What is wrong.
        why: String,
    },
    /// The files are not the shards of one run.
    #[error("{file}: {why}")]
    Mismatch {
        /// The file that does not fit.
        file: String,
        /// How.
        why: String,
    },
    /// Some shards are missing.
    #[error("shards missing: {0} (give every shard's --json)")]
    Missing(String),
    /// Nothing to merge.
    #[error("merge needs at least one shard's --json")]
    Nothing,
}

impl Shard {
    /// Parses `i/n`.
    pub fn parse(text: &str) -> Result<Shard, ShardError> {
        let bad = || ShardError::Syntax(text.to_owned());
        let (i, n) = text.split_once('/').ok_or_else(bad)?;
        let (index, count) = (
            i.trim().parse::<u64>().map_err(|_| bad())?,
            n.trim().parse::<u64>().map_err(|_| bad())?,
        );
        if index == 0 || index > count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }

    /// Whether the item `offset` places from the first (a seed, a fuzz
    /// case) is this shard's: every `count`th from the `index`th.
    pub fn owns(self, offset: u64) -> bool {
        offset % self.count == self.index - 1
    }

    /// The seeds of `from..to` this shard runs: every `count`th from the
    /// `index`th.
    pub fn seeds(self, from: u64, to: u64) -> Vec<u64> {
        (from..to).filter(|s| self.owns(s - from)).collect()
    }
}

/// The seeds of `from..to` that `shard` runs (all of them without one).
pub fn seeds_of(shard: Option<Shard>, from: u64, to: u64) -> Vec<u64> {
    shard.map_or_else(|| (from..to).collect(), |s| s.seeds(from, to))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_split_the_seeds_by_index_modulo_n() {
        let s = Shard::parse("2/3").unwrap();
        assert_eq!(s, Shard { index: 2, count: 3 });
        assert_eq!(s.seeds(10, 18), [11, 14, 17]);
        let all: Vec<u64> = {
            let mut v: Vec<u64> = (1..=3)
                .flat_map(|i| Shard { index: i, count: 3 }.seeds(10, 18))
                .collect();
            v.sort_unstable();
            v
        };
        assert_eq!(all, (10..18).collect::<Vec<_>>());
        for bad in ["0/3", "4/3", "1", "a/b", "1/0"] {
            assert_eq!(Shard::parse(bad), Err(ShardError::Syntax(bad.into())));
        }
    }
}
