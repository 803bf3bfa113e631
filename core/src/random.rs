//! The randomness port: where jitter (and any other random draw) comes from.
//!
//! Jitter exists so a fleet that failed together does not retry together; a
//! test or a simulation still needs the same draws on every run. So the source
//! is injected: [`SeededRandom`] is a ChaCha stream from an explicit seed, and
//! [`SeededRandom::from_os_entropy`] is the production default and the one place
//! in the crate allowed to touch OS entropy.

use std::sync::{Arc, Mutex};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A shared source of uniform random numbers.
pub trait RandomSource: Send + Sync + 'static {
    /// A uniformly distributed 64-bit value.
    fn next_u64(&self) -> u64;

    /// A uniform draw from `[0, 1)`.
    fn next_f64(&self) -> f64 {
        // 53 random mantissa bits: exactly representable, never 1.0.
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

impl<R: RandomSource + ?Sized> RandomSource for Arc<R> {
    fn next_u64(&self) -> u64 {
        (**self).next_u64()
    }
}

/// A ChaCha8 stream behind a mutex: reproducible from its seed, shareable across
/// tasks.
#[derive(Debug)]
pub struct SeededRandom {
    rng: Mutex<ChaCha8Rng>,
}

impl SeededRandom {
    /// A stream determined entirely by `seed`.
    pub fn from_seed(seed: u64) -> Self {
        SeededRandom {
            rng: Mutex::new(ChaCha8Rng::seed_from_u64(seed)),
        }
    }

    /// A stream seeded from the operating system: the production default.
    #[allow(clippy::disallowed_methods)] // allowed: the production RNG is the one reader of OS entropy.
    pub fn from_os_entropy() -> Self {
        SeededRandom {
            rng: Mutex::new(ChaCha8Rng::from_os_rng()), // allowed: the production RNG
        }
    }
}

impl RandomSource for SeededRandom {
    fn next_u64(&self) -> u64 {
        self.rng.lock().unwrap_or_else(|p| p.into_inner()).random()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let a = SeededRandom::from_seed(7);
        let b = SeededRandom::from_seed(7);
        let xs: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..5).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(
            xs,
            (0..5)
                .map(|_| SeededRandom::from_seed(8).next_u64())
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn floats_are_in_the_unit_interval() {
        let r = SeededRandom::from_seed(1);
        for _ in 0..10_000 {
            let x = r.next_f64();
            assert!((0.0..1.0).contains(&x));
        }
    }
}
