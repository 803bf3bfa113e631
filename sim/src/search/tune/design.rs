//! The design: the grid when small, else a seeded Latin hypercube.

use super::*;

/// How the candidates were chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DesignKind {
    /// Every combination.
    Grid,
    /// A seeded Latin hypercube.
    LatinHypercube,
}

/// The candidates to evaluate: per candidate, one value per dimension.
#[derive(Clone, Debug, PartialEq)]
pub struct Design {
    /// Grid or drawn.
    pub kind: DesignKind,
    /// The grid's size (`None`: a continuous dimension makes it infinite,
    /// or it does not fit in 64 bits).
    pub grid_size: Option<u64>,
    /// Per candidate, its values in `dims` order.
    pub candidates: Vec<Vec<String>>,
}

/// The design for `dims`: the grid when it has at most `budget` points,
/// else `budget` Latin-hypercube draws from `seed` (duplicates dropped).
pub fn design(dims: &[Dim], budget: u64, seed: u64) -> Design {
    let grid_size = dims
        .iter()
        .try_fold(1u64, |acc, d| d.levels().and_then(|n| acc.checked_mul(n)));
    if let Some(size) = grid_size.filter(|&s| s <= budget) {
        let mut candidates = Vec::new();
        for mut i in 0..size {
            let mut values = Vec::with_capacity(dims.len());
            // The last dimension varies fastest.
            for d in dims.iter().rev() {
                let n = d.levels().unwrap_or(1);
                values.push(d.level(i % n));
                i /= n;
            }
            values.reverse();
            candidates.push(values);
        }
        return Design {
            kind: DesignKind::Grid,
            grid_size,
            candidates,
        };
    }
    let n = usize::try_from(budget).unwrap_or(usize::MAX).max(1);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let columns: Vec<Vec<String>> = dims
        .iter()
        .map(|d| {
            let mut strata: Vec<usize> = (0..n).collect();
            strata.shuffle(&mut rng);
            strata
                .into_iter()
                .map(|s| {
                    let jitter: f64 = rng.random();
                    d.at((s as f64 + jitter) / n as f64)
                })
                .collect()
        })
        .collect();
    let mut candidates: Vec<Vec<String>> = Vec::with_capacity(n);
    for i in 0..n {
        let values: Vec<String> = columns.iter().map(|c| c[i].clone()).collect();
        if !candidates.contains(&values) {
            candidates.push(values);
        }
    }
    Design {
        kind: DesignKind::LatinHypercube,
        grid_size,
        candidates,
    }
}
