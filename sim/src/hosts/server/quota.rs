//! A hosted endpoint's quotas: requests-per-minute and tokens-per-minute
//! buckets per API key, a daily request cap, a credit budget, and the
//! headers computed from them.
//!
//! Tuning `rpm` against a provider's quota needs a quota that behaves like
//! one, not a 429 coin flip. OpenAI counts limits per minute in requests and
//! tokens, "whichever limit is hit first applies", and charges a request at
//! admission "the maximum of `max_tokens` and the estimated number of tokens"
//! of the prompt (<https://developers.openai.com/api/docs/guides/rate-limits>).
//! Here each limit is a token bucket holding at most the limit and refilling
//! it evenly over 60 s; a request is admitted only if both buckets hold its
//! charge, and a refused request takes nothing. The headers follow the guide's
//! table: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, resets as
//! Go durations (`1s`, `6m0s`, `120ms`) meaning the time until the bucket is
//! full again; a 429 adds `retry-after` (whole seconds, rounded up) and
//! `retry-after-ms`, the time until the bucket holds the charge — the two
//! headers the core's adapter reads (`retry-after-ms` first). A daily cap
//! (`rpd`) is a fixed window from the run's start: once a key has spent it,
//! every request is refused until the day ends, hours away — as a free
//! tier's daily cap answers (OpenRouter's `free-models-per-day`,
//! langwatch/langwatch#7027). Pure: time is an argument.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::scenario::Quota;

/// One per-minute limit as a token bucket.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bucket {
    limit: f64,
    level: f64,
    at: Duration,
}

impl Bucket {
    /// A full bucket of `limit` per minute, at `at`.
    pub fn new(limit: u64, at: Duration) -> Self {
        Bucket {
            limit: limit as f64,
            level: limit as f64,
            at,
        }
    }

    fn rate_per_s(&self) -> f64 {
        self.limit / 60.0
    }

    fn refill(&mut self, now: Duration) {
        if now > self.at {
            let gained = (now - self.at).as_secs_f64() * self.rate_per_s();
            self.level = (self.level + gained).min(self.limit);
            self.at = now;
        }
    }

    /// What it holds now, rounded down.
    pub fn remaining(&self) -> u64 {
        self.level.max(0.0).floor() as u64
    }

    /// Time until it is full again.
    pub fn reset_in(&self) -> Duration {
        secs((self.limit - self.level).max(0.0) / self.rate_per_s())
    }

    /// Time until it holds `n`.
    fn wait_for(&self, n: f64) -> Duration {
        secs((n - self.level).max(0.0) / self.rate_per_s())
    }
}

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)
}

/// Which limit refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// Requests per minute.
    Requests,
    /// Tokens per minute.
    Tokens,
    /// Requests per day.
    RequestsPerDay,
}

/// The length of a daily cap's window.
pub const DAY: Duration = Duration::from_secs(24 * 60 * 60);

/// The quota's answer to one request.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Admitted; both buckets were charged.
    Admit,
    /// Refused until `retry_after`: the bucket of `limit` lacks the charge.
    Limited {
        /// The limit hit first (requests before tokens).
        limit: Limit,
        /// Until the bucket holds the charge.
        retry_after: Duration,
        /// The charge asked for (1 for requests).
        requested: u64,
        /// What that bucket's limit had used.
        used: u64,
    },
    /// The request alone exceeds the tokens-per-minute limit: it can never pass.
    TooLarge {
        /// Its charge.
        requested: u64,
    },
    /// The credit is spent.
    Exhausted,
}

/// The buckets of one API key.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyBuckets {
    /// Requests per minute.
    pub requests: Bucket,
    /// Tokens per minute.
    pub tokens: Bucket,
    /// The day `today` counts (days since the run's start).
    pub day: u64,
    /// Requests admitted in that day.
    pub today: u64,
}

/// An account's credit left, in tokens (`None`: unlimited), shared by
/// the servers of one quota group — several keys of one account — and kept
/// across their restarts.
#[derive(Clone, Debug)]
pub struct Credit(Arc<Mutex<Option<u64>>>);

impl Credit {
    /// An account holding `tokens`.
    pub fn new(tokens: Option<u64>) -> Self {
        Credit(Arc::new(Mutex::new(tokens)))
    }

    fn left(&self) -> Option<u64> {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn spend(&self, tokens: u64) {
        if let Some(left) = &mut *self.0.lock().unwrap_or_else(|p| p.into_inner()) {
            *left = left.saturating_sub(tokens);
        }
    }
}

impl PartialEq for Credit {
    fn eq(&self, other: &Credit) -> bool {
        self.left() == other.left()
    }
}

/// Every key's buckets and the account's remaining credit.
#[derive(Clone, Debug, PartialEq)]
pub struct Quotas {
    quota: Quota,
    keys: BTreeMap<String, KeyBuckets>,
    credit: Credit,
}

impl Quotas {
    /// Fresh buckets for `quota`, on an account of its own.
    pub fn new(quota: Quota) -> Self {
        Quotas::on(quota, Credit::new(quota.credit_tokens))
    }

    /// Fresh buckets for `quota`, spending `credit` — an account shared
    /// with other servers.
    pub fn on(quota: Quota, credit: Credit) -> Self {
        Quotas {
            quota,
            keys: BTreeMap::new(),
            credit,
        }
    }

    fn key(&mut self, key: &str, now: Duration) -> &mut KeyBuckets {
        let q = self.quota;
        let buckets = self.keys.entry(key.to_owned()).or_insert_with(|| KeyBuckets {
            requests: Bucket::new(u64::from(q.rpm), now),
            tokens: Bucket::new(q.tpm, now),
            day: 0,
            today: 0,
        });
        let day = now.as_secs() / DAY.as_secs();
        if buckets.day != day {
            buckets.day = day;
            buckets.today = 0;
        }
        buckets.requests.refill(now);
        buckets.tokens.refill(now);
        buckets
    }

    /// Decides on a request of key `key` charging `tokens`, at `now`, and
    /// charges it when admitted.
    pub fn admit(&mut self, key: &str, tokens: u64, now: Duration) -> Decision {
        if self.credit.left() == Some(0) {
            return Decision::Exhausted;
        }
        let (tpm, rpd) = (self.quota.tpm, self.quota.rpd);
        let b = self.key(key, now);
        if let Some(rpd) = rpd
            && b.today >= u64::from(rpd)
        {
            let day_end = DAY.saturating_mul(u32::try_from(b.day.saturating_add(1)).unwrap_or(u32::MAX));
            return Decision::Limited {
                limit: Limit::RequestsPerDay,
                retry_after: day_end.saturating_sub(now),
                requested: 1,
                used: b.today,
            };
        }
        if b.requests.level < 1.0 {
            return Decision::Limited {
                limit: Limit::Requests,
                retry_after: b.requests.wait_for(1.0),
                requested: 1,
                used: (b.requests.limit - b.requests.level).max(0.0).ceil() as u64,
            };
        }
        if tokens > tpm {
            return Decision::TooLarge { requested: tokens };
        }
        if b.tokens.level < tokens as f64 {
            return Decision::Limited {
                limit: Limit::Tokens,
                retry_after: b.tokens.wait_for(tokens as f64),
                requested: tokens,
                used: (b.tokens.limit - b.tokens.level).max(0.0).ceil() as u64,
            };
        }
        b.requests.level -= 1.0;
        b.tokens.level -= tokens as f64;
        b.today += 1;
        Decision::Admit
    }

    /// Spends `tokens` of the credit (a served request's usage).
    pub fn spend(&mut self, tokens: u64) {
        self.credit.spend(tokens);
    }

    /// The `x-ratelimit-*` headers for key `key` at `now`, in the guide's order.
    pub fn headers(&mut self, key: &str, now: Duration) -> Vec<(&'static str, String)> {
        let q = self.quota;
        let b = self.key(key, now);
        vec![
            ("x-ratelimit-limit-requests", q.rpm.to_string()),
            ("x-ratelimit-limit-tokens", q.tpm.to_string()),
            ("x-ratelimit-remaining-requests", b.requests.remaining().to_string()),
            ("x-ratelimit-remaining-tokens", b.tokens.remaining().to_string()),
            ("x-ratelimit-reset-requests", go_duration(b.requests.reset_in())),
            ("x-ratelimit-reset-tokens", go_duration(b.tokens.reset_in())),
        ]
    }
}

/// A duration as Go's `time.Duration.String` writes it, to the millisecond
/// (rounded up): `0s`, `120ms`, `1s`, `6m0s`, `4m12.172s`, `23h18m29.144s`.
pub fn go_duration(d: Duration) -> String {
    let ms = d.as_micros().div_ceil(1000);
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, rest) = (ms / 3_600_000, ms % 3_600_000);
    let (m, rest) = (rest / 60_000, rest % 60_000);
    let (s, frac) = (rest / 1000, rest % 1000);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if h > 0 || m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if frac == 0 {
        out.push_str(&format!("{s}s"));
    } else {
        let frac = format!("{frac:03}");
        out.push_str(&format!("{s}.{}s", frac.trim_end_matches('0')));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_one_account_spend_one_credit_and_keep_their_own_buckets() {
        let q = Quota {
            credit_tokens: Some(100),
            ..quota()
        };
        let account = Credit::new(q.credit_tokens);
        let (mut a, mut b) = (Quotas::on(q, account.clone()), Quotas::on(q, account));
        let now = Duration::from_secs(1);
        assert_eq!(a.admit("k", 10, now), Decision::Admit);
        a.spend(100);
        assert_eq!(b.admit("k", 10, now), Decision::Exhausted, "the account is spent");
        // A server on an account of its own still has its credit.
        assert_eq!(Quotas::new(q).admit("k", 10, now), Decision::Admit);
    }

    fn quota() -> Quota {
        Quota {
            rpm: 60,
            tpm: 1000,
            credit_tokens: None,
            rpd: None,
        }
    }

    #[test]
    fn a_daily_cap_refuses_until_the_day_ends() {
        let mut q = Quotas::new(Quota {
            rpd: Some(3),
            ..quota()
        });
        let t = Duration::from_secs(600);
        for _ in 0..3 {
            assert_eq!(q.admit("k", 1, t), Decision::Admit);
        }
        let later = t + Duration::from_secs(3_600);
        assert_eq!(
            q.admit("k", 1, later),
            Decision::Limited {
                limit: Limit::RequestsPerDay,
                retry_after: DAY - later,
                requested: 1,
                used: 3,
            }
        );
        assert_eq!(q.admit("other", 1, later), Decision::Admit, "per key");
        assert_eq!(q.admit("k", 1, DAY), Decision::Admit, "a new day");
    }

    #[test]
    fn go_durations_read_like_openais() {
        assert_eq!(go_duration(Duration::ZERO), "0s");
        assert_eq!(go_duration(Duration::from_millis(120)), "120ms");
        assert_eq!(go_duration(Duration::from_micros(11_200)), "12ms");
        assert_eq!(go_duration(Duration::from_secs(1)), "1s");
        assert_eq!(go_duration(Duration::from_secs(360)), "6m0s");
        assert_eq!(go_duration(Duration::from_millis(252_172)), "4m12.172s");
        assert_eq!(go_duration(Duration::from_millis(83_909_144)), "23h18m29.144s");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
    }

    #[test]
    fn the_request_bucket_refuses_the_61st_request_and_says_when() {
        let mut q = Quotas::new(quota());
        let t0 = Duration::from_secs(10);
        for _ in 0..60 {
            assert_eq!(q.admit("k", 1, t0), Decision::Admit);
        }
        let Decision::Limited {
            limit,
            retry_after,
            used,
            ..
        } = q.admit("k", 1, t0)
        else {
            panic!()
        };
        assert_eq!(
            (limit, retry_after, used),
            (Limit::Requests, Duration::from_secs(1), 60)
        );
        let h = q.headers("k", t0);
        assert_eq!(h[2], ("x-ratelimit-remaining-requests", "0".into()));
        assert_eq!(h[4], ("x-ratelimit-reset-requests", "1m0s".into()));
        // One second later one request's worth has come back.
        assert_eq!(q.admit("k", 1, t0 + Duration::from_secs(1)), Decision::Admit);
        assert_eq!(q.admit("other", 1, t0), Decision::Admit, "buckets are per key");
    }

    #[test]
    fn tokens_are_charged_and_refused_by_their_own_bucket() {
        let mut q = Quotas::new(quota());
        assert_eq!(q.admit("k", 900, Duration::ZERO), Decision::Admit);
        let Decision::Limited {
            limit,
            retry_after,
            requested,
            used,
        } = q.admit("k", 200, Duration::ZERO)
        else {
            panic!()
        };
        assert_eq!((limit, requested, used), (Limit::Tokens, 200, 900));
        // 100 more tokens at 1000/60 per second: 6 s.
        assert_eq!(retry_after, Duration::from_secs(6));
        assert_eq!(
            q.admit("k", 2000, Duration::ZERO),
            Decision::TooLarge { requested: 2000 }
        );
        let h = q.headers("k", Duration::ZERO);
        assert_eq!(h[3], ("x-ratelimit-remaining-tokens", "100".into()));
        assert_eq!(h[5], ("x-ratelimit-reset-tokens", "54s".into()));
    }

    #[test]
    fn a_spent_credit_refuses_everything() {
        let mut q = Quotas::new(Quota {
            credit_tokens: Some(100),
            ..quota()
        });
        assert_eq!(q.admit("k", 1, Duration::ZERO), Decision::Admit);
        q.spend(60);
        assert_eq!(q.admit("k", 1, Duration::ZERO), Decision::Admit);
        q.spend(60);
        assert_eq!(q.admit("k", 1, Duration::ZERO), Decision::Exhausted);
    }
}
