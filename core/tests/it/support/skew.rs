//! The skew property, shared by the memory and Redis adapters' tests: callers
//! whose clocks are off by random amounts race for one tenant's slots on one
//! store; the admitted stamps must never hold more than `limit` in any window
//! (the limit is exact in stamp time), and the admissions in any window of the
//! store's (true) time must stay within `decide::window::skew_bound` for the spread
//! of the callers' clamped offsets.

use std::time::Duration;

use proptest::prelude::*;
use redstring::Timestamp;
use redstring::cache::{LimiterStore, SlotRequest};
use redstring::decide::window::{SlotOutcome, skew_bound};

/// One case: the callers' clock offsets (µs, may be far off) and the calls,
/// each a caller and the true time that passes before it.
#[derive(Clone, Debug)]
pub struct SkewCase {
    /// Each caller's clock offset from the store's, in µs.
    pub offsets: Vec<i64>,
    /// (caller, gap before the call).
    pub calls: Vec<(usize, Duration)>,
    /// Slots per window.
    pub limit: u32,
}

/// Cases for a window of `window`: offsets up to three windows either way (in
/// tenths of a window, so some callers agree exactly), gaps up to a third of
/// a window.
pub fn cases(window: Duration, max_calls: usize) -> impl Strategy<Value = SkewCase> {
    let tenth = i64::try_from(window.as_micros() / 10).unwrap();
    let gap_unit = window.as_micros() as u64 / 30;
    (
        prop::collection::vec(prop_oneof![2 => Just(0i64), 3 => -30i64..=30], 1..5),
        1u32..6,
    )
        .prop_flat_map(move |(offsets, limit)| {
            let n = offsets.len();
            (
                Just(offsets.into_iter().map(|o| o * tenth).collect::<Vec<_>>()),
                prop::collection::vec(
                    (0..n, (0u64..=10).prop_map(move |g| Duration::from_micros(g * gap_unit))),
                    1..max_calls,
                ),
                Just(limit),
            )
        })
        .prop_map(|(offsets, calls, limit)| SkewCase { offsets, calls, limit })
}

/// An admitted call: the store's (true) time it was made at, and its stamp.
#[derive(Clone, Copy, Debug)]
pub struct Admitted {
    /// The true time, on the store's clock.
    pub true_at: Timestamp,
    /// The stamp the store recorded.
    pub stamp: Timestamp,
}

/// Shifts `t` by `offset` µs.
pub fn shift(t: Timestamp, offset: i64) -> Timestamp {
    if offset >= 0 {
        t.saturating_add(Duration::from_micros(offset.unsigned_abs()))
    } else {
        t.saturating_sub(Duration::from_micros(offset.unsigned_abs()))
    }
}

/// Runs `case` on `store`: before each call, `advance` lets the gap pass and
/// returns the store's time; each caller asks at that time plus its offset.
pub async fn run<S: LimiterStore>(
    store: &S,
    key: &str,
    case: &SkewCase,
    window: Duration,
    max_ahead: Duration,
    mut advance: impl AsyncFnMut(Duration) -> Timestamp,
) -> Vec<Admitted> {
    let mut admitted = Vec::new();
    for &(caller, gap) in &case.calls {
        let true_at = advance(gap).await;
        let request = SlotRequest {
            now: shift(true_at, case.offsets[caller]),
            window,
            limit: case.limit,
            ttl: window * 2 + max_ahead + Duration::from_micros(1),
            max_ahead,
        };
        if let SlotOutcome::Admitted { at, .. } = store.acquire_slot(key, request).await.unwrap() {
            admitted.push(Admitted { true_at, stamp: at });
        }
    }
    admitted
}

/// The spread of the callers' offsets after clamping into `[−window, max_ahead]`.
pub fn clamped_spread(offsets: &[i64], window: Duration, max_ahead: Duration) -> Duration {
    let lo = -i64::try_from(window.as_micros()).unwrap();
    let hi = i64::try_from(max_ahead.as_micros()).unwrap();
    let clamped: Vec<i64> = offsets.iter().map(|o| (*o).clamp(lo, hi)).collect();
    let spread = clamped.iter().max().unwrap() - clamped.iter().min().unwrap();
    Duration::from_micros(spread.unsigned_abs())
}

/// The most instants of `times` in any closed interval of width `window`.
pub fn densest(mut times: Vec<Timestamp>, window: Duration) -> usize {
    times.sort();
    let mut best = 0;
    let mut start = 0;
    for end in 0..times.len() {
        while times[end].saturating_duration_since(times[start]) > window {
            start += 1;
        }
        best = best.max(end - start + 1);
    }
    best
}

/// Checks both halves of the property, with `slack` of true time allowed for
/// a store whose clock is read a little after the caller's (a real server).
pub fn check(case: &SkewCase, admitted: &[Admitted], window: Duration, max_ahead: Duration, slack: Duration) {
    let in_stamp_time = densest(admitted.iter().map(|a| a.stamp).collect(), window);
    assert!(
        in_stamp_time <= case.limit as usize,
        "{in_stamp_time} stamps within one window, limit {}: {case:?} {admitted:?}",
        case.limit
    );
    let spread = clamped_spread(&case.offsets, window, max_ahead) + slack;
    let bound = skew_bound(case.limit, window, max_ahead, spread);
    let in_true_time = densest(admitted.iter().map(|a| a.true_at).collect(), window);
    assert!(
        in_true_time as u64 <= bound,
        "{in_true_time} admissions within one window of true time, bound {bound} for a spread of {spread:?}: {case:?}"
    );
}
