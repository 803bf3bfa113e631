//! Token budgets: tokens per window beside requests per window, reserved at
//! admission in the same atomic step as the request slot, settled to what the
//! server says it used.
//!
//! A model server's quota is in tokens as much as in requests (a hosted
//! endpoint's `tpm`, a GPU's KV cache). Charging tokens after the response —
//! as gateways that read `usage` do — lets every call in flight pass the
//! check at once and overshoot together. Here a call **reserves** an estimate
//! (its prompt estimate plus `max_tokens`) when it is admitted, and the store
//! refuses a reservation that would take the window over its limit; the call
//! later **settles** the reservation to the actual `usage` (a refund or a
//! charge), or **releases** it (settles to zero) when it fails before the
//! server used anything. An unsettled reservation is a **lease**: it counts
//! until `lease` after it was made, so a dropped future cannot hold tokens
//! for good.
//!
//! The decision is [`decide_tokens`], the one definition every adapter runs
//! over a tenant's ledger of [`TokenEntry`]s (a Redis script line for line).
//!
//! # The bound
//!
//! At any decision the tokens counted in the window plus the new estimate
//! are at most the limit. Settling can charge more than was reserved, so
//! over any window the tokens admitted are at most
//! `limit + Σ (actual − estimate)⁺` over the calls settled above their
//! estimate — at most one call's estimation error per call in flight at a
//! decision. A call whose estimate covers its `max_tokens` and whose prompt
//! was estimated from above never settles above it. With a `lease` shorter
//! than the window, add what reservations that outlived their lease were
//! later settled to: they stopped counting while still in the window. With
//! the default lease, the window, that term is zero.

use std::time::Duration;

use super::window::SlotOutcome;
use crate::time::{Timestamp, stored_number};

/// What a call asks of the token budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TokenAsk {
    /// The estimate to reserve (prompt estimate + `max_tokens`).
    pub tokens: u64,
    /// Tokens allowed per window.
    pub limit: u64,
    /// How long an unsettled reservation counts.
    pub lease: Duration,
}

/// Names one reservation: the instant it was stamped at and its place among
/// the reservations stamped at that same instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ReservationId {
    /// The stamp it was reserved at.
    pub at: Timestamp,
    /// How many reservations already sat at that stamp.
    pub seq: u32,
}

/// One reservation in a tenant's ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenEntry {
    /// Which reservation.
    pub id: ReservationId,
    /// Tokens it holds: the estimate until settled, then the actual use.
    pub tokens: u64,
    /// When an unsettled reservation stops counting; `None` once settled.
    pub lease_end: Option<Timestamp>,
}

impl TokenEntry {
    /// What this entry counts at `now`: its tokens, or nothing once its
    /// lease ended unsettled (a lease is inclusive, as the window is: a
    /// reservation leased for exactly one window counts as long as its hit).
    pub fn counted(&self, now: Timestamp) -> u64 {
        match self.lease_end {
            Some(end) if end < now => 0,
            _ => self.tokens,
        }
    }

    /// The stored form, `"{at µs}:{seq}:{tokens}:{lease_end µs or empty}"`,
    /// as every adapter writes it.
    pub fn encode(&self) -> String {
        let lease = self.lease_end.map(|t| t.as_micros().to_string()).unwrap_or_default();
        format!("{}:{}:{}:{lease}", self.id.at.as_micros(), self.id.seq, self.tokens)
    }

    /// Reads a stored form; `None` for anything [`encode`](Self::encode)
    /// would not have written (numbers of at most 2⁵³ only).
    pub fn decode(stored: &str) -> Option<Self> {
        let mut parts = stored.split(':');
        let at = stored_number(parts.next()?)?;
        let seq = u32::try_from(stored_number(parts.next()?)?).ok()?;
        let tokens = stored_number(parts.next()?)?;
        let lease = parts.next()?;
        if parts.next().is_some() {
            return None;
        }
        let lease_end = if lease.is_empty() {
            None
        } else {
            Some(Timestamp::from_micros(stored_number(lease)?))
        };
        Some(TokenEntry {
            id: ReservationId {
                at: Timestamp::from_micros(at),
                seq,
            },
            tokens,
            lease_end,
        })
    }
}

/// The token budget's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum TokenDecision {
    /// The estimate fits: `used` tokens were counted before it.
    Fits {
        /// Tokens counted in the window before this reservation.
        used: u64,
    },
    /// It does not fit yet.
    Refused {
        /// Tokens counted in the window.
        used: u64,
        /// How long until enough has aged out of the window or lost its
        /// lease for the estimate to fit, if nothing else is reserved
        /// meanwhile. Never zero.
        retry_after: Duration,
    },
    /// The estimate alone is over the limit: it never fits.
    TooLarge,
}

/// Decides a reservation of `ask` at `now` over `entries`, the tenant's
/// ledger (any order; entries stamped before `now − window` are ignored).
/// An estimate that fits allocates nothing.
pub fn decide_tokens(entries: &[TokenEntry], ask: &TokenAsk, now: Timestamp, window: Duration) -> TokenDecision {
    if ask.tokens > ask.limit {
        return TokenDecision::TooLarge;
    }
    let since = now.saturating_sub(window);
    let counted = |e: &TokenEntry| if e.id.at < since { 0 } else { e.counted(now) };
    let used = entries.iter().map(counted).fold(0u64, u64::saturating_add);
    if used.saturating_add(ask.tokens) <= ask.limit {
        return TokenDecision::Fits { used };
    }
    // Refused: when each counted entry stops counting, and how much it frees
    // then (gathered only now, so an admission allocates nothing).
    let mut frees: Vec<(Timestamp, u64)> = entries
        .iter()
        .filter_map(|e| {
            let amount = counted(e);
            let last = match e.lease_end {
                Some(end) => end.min(e.id.at.saturating_add(window)),
                None => e.id.at.saturating_add(window),
            };
            (amount > 0).then(|| (last.saturating_add(Duration::from_micros(1)), amount))
        })
        .collect();
    frees.sort_unstable();
    let mut left = used;
    for (at, amount) in frees {
        left = left.saturating_sub(amount);
        if left.saturating_add(ask.tokens) <= ask.limit {
            return TokenDecision::Refused {
                used,
                retry_after: at.saturating_duration_since(now).max(Duration::from_micros(1)),
            };
        }
    }
    // Unreachable while `ask.tokens <= ask.limit`: once everything frees,
    // the estimate fits.
    TokenDecision::Refused {
        used,
        retry_after: window,
    }
}

/// Settles reservation `id` in `entries` to `actual` tokens: `true` when it
/// was found (settling again, or after its lease, still sets the actual use),
/// `false` when the ledger no longer holds it.
pub fn settle_entry(entries: &mut [TokenEntry], id: ReservationId, actual: u64) -> bool {
    match entries.iter_mut().find(|e| e.id == id) {
        Some(e) => {
            e.tokens = actual;
            e.lease_end = None;
            true
        }
        None => false,
    }
}

/// Which limit refused a call that asked for tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum RefusedBy {
    /// The requests per window.
    Requests,
    /// The tokens per window.
    Tokens,
    /// Both at once.
    Both,
    /// The estimate alone is over the tokens per window: it never fits.
    TooLarge,
}

/// The answer to [`TokenStore::acquire_with_tokens`](crate::cache::TokenStore::acquire_with_tokens).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum TokenOutcome {
    /// A hit and a reservation were recorded, at `reservation.at`.
    Admitted {
        /// Slots left in the window after this one.
        remaining: u32,
        /// Tokens counted in the window before this reservation.
        tokens_used: u64,
        /// The reservation, to settle or release.
        reservation: ReservationId,
        /// The caller's stamp was clamped.
        clamped: bool,
    },
    /// Nothing was recorded.
    Refused {
        /// Which limit refused.
        by: RefusedBy,
        /// Hits in the window.
        requests_used: u64,
        /// Tokens counted in the window.
        tokens_used: u64,
        /// How long until every refusing limit would admit, if nothing else
        /// is recorded meanwhile (the window for [`RefusedBy::TooLarge`]).
        retry_after: Duration,
        /// The instant the decision was made at.
        at: Timestamp,
        /// The caller's stamp was clamped.
        clamped: bool,
    },
}

impl TokenOutcome {
    /// The instant the decision was made at.
    pub fn at(&self) -> Timestamp {
        match *self {
            TokenOutcome::Admitted { reservation, .. } => reservation.at,
            TokenOutcome::Refused { at, .. } => at,
        }
    }
}

/// The combined decision: the request slot ([`decide`](super::window::decide)'s
/// answer for `count` hits) and the token reservation together. Admitted
/// only when both fit; `seq` numbers the reservation among those already at
/// `now`.
pub fn combine(
    count: u64,
    slot: SlotOutcome,
    tokens: TokenDecision,
    now: Timestamp,
    seq: u32,
    window: Duration,
) -> TokenOutcome {
    let refused = |by, tokens_used, retry_after| TokenOutcome::Refused {
        by,
        requests_used: count,
        tokens_used,
        retry_after,
        at: now,
        clamped: false,
    };
    match (slot, tokens) {
        (SlotOutcome::Admitted { remaining, .. }, TokenDecision::Fits { used }) => TokenOutcome::Admitted {
            remaining,
            tokens_used: used,
            reservation: ReservationId { at: now, seq },
            clamped: false,
        },
        (_, TokenDecision::TooLarge) => refused(RefusedBy::TooLarge, 0, window),
        (SlotOutcome::Refused { retry_after, .. }, TokenDecision::Fits { used }) => {
            refused(RefusedBy::Requests, used, retry_after)
        }
        (SlotOutcome::Admitted { .. }, TokenDecision::Refused { used, retry_after }) => {
            refused(RefusedBy::Tokens, used, retry_after)
        }
        (SlotOutcome::Refused { retry_after: a, .. }, TokenDecision::Refused { used, retry_after: b }) => {
            refused(RefusedBy::Both, used, a.max(b))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: u64) -> Timestamp {
        Timestamp::from_secs(s)
    }

    fn entry(s: u64, tokens: u64, lease_end: Option<u64>) -> TokenEntry {
        TokenEntry {
            id: ReservationId { at: at(s), seq: 0 },
            tokens,
            lease_end: lease_end.map(at),
        }
    }

    const ASK: TokenAsk = TokenAsk {
        tokens: 400,
        limit: 1000,
        lease: Duration::from_secs(30),
    };

    #[test]
    fn an_estimate_fits_up_to_the_limit_and_no_further() {
        let w = Duration::from_secs(60);
        assert_eq!(
            decide_tokens(&[entry(10, 600, None)], &ASK, at(20), w),
            TokenDecision::Fits { used: 600 }
        );
        let full = [entry(10, 601, None)];
        assert_eq!(
            decide_tokens(&full, &ASK, at(20), w),
            TokenDecision::Refused {
                used: 601,
                // The entry leaves the inclusive window one µs after 70 s.
                retry_after: Duration::from_secs(50) + Duration::from_micros(1),
            }
        );
    }

    #[test]
    fn an_unsettled_lease_frees_its_tokens_when_it_ends() {
        let w = Duration::from_secs(60);
        let leased = [entry(10, 700, Some(25))];
        assert_eq!(
            decide_tokens(&leased, &ASK, at(20), w),
            TokenDecision::Refused {
                used: 700,
                retry_after: Duration::from_secs(5) + Duration::from_micros(1),
            }
        );
        assert!(
            matches!(decide_tokens(&leased, &ASK, at(25), w), TokenDecision::Refused { .. }),
            "the lease's last µs"
        );
        let after = at(25).saturating_add(Duration::from_micros(1));
        assert_eq!(decide_tokens(&leased, &ASK, after, w), TokenDecision::Fits { used: 0 });
    }

    #[test]
    fn entries_before_the_window_do_not_count_and_an_oversized_ask_never_fits() {
        let w = Duration::from_secs(60);
        assert_eq!(
            decide_tokens(&[entry(0, 1000, None)], &ASK, at(61), w),
            TokenDecision::Fits { used: 0 }
        );
        let huge = TokenAsk { tokens: 1001, ..ASK };
        assert_eq!(decide_tokens(&[], &huge, at(0), w), TokenDecision::TooLarge);
    }

    #[test]
    fn settling_sets_the_actual_use_and_ends_the_lease() {
        let mut ledger = [entry(10, 700, Some(40))];
        let id = ledger[0].id;
        assert!(settle_entry(&mut ledger, id, 250));
        assert_eq!(ledger[0], entry(10, 250, None));
        let other = ReservationId { at: at(11), seq: 0 };
        assert!(!settle_entry(&mut ledger, other, 1));
    }

    #[test]
    fn stored_entries_round_trip_and_foreign_forms_are_refused() {
        for e in [entry(10, 700, Some(40)), entry(1_700_000_000, 0, None)] {
            assert_eq!(TokenEntry::decode(&e.encode()), Some(e));
        }
        for bad in [
            "",
            "1:2:3",
            "1:2:3:4:5",
            "a:0:1:",
            "1:-1:2:",
            "1:2:x:",
            "9007199254740993:0:1:",
        ] {
            assert_eq!(TokenEntry::decode(bad), None, "{bad:?}");
        }
    }
}
