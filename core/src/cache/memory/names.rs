//! How a hit series is named inside the store: a limiter's tenant by its id,
//! anything else by its key.
//!
//! A limiter's key is `{prefix}:{tenant}` — 49 bytes to format, check and
//! hash twice on every `acquire`. The store instead interns each prefix once
//! (a small number; a process has a limiter or two) and keys the tenant's
//! series by `(prefix id, tenant id)`; a limiter resolves its prefix to the
//! id once, when it is built ([`TenantPrefix`](crate::cache::TenantPrefix)),
//! so that its decisions look nothing up (a lookup by the text cost each
//! about 27 instructions) — a prefix takes its place in the table then,
//! whether or not the limiter ever decides. A cache that did not resolve
//! the prefix (a limiter's local fallback) looks it up by its text, and a
//! prefix that has no id (too long, a hash tag, the table full) names its
//! tenants by their keys. The string form still names the same
//! series: a key of exactly that shape, by whatever path it arrives
//! ([`HitWindow`](crate::cache::HitWindow), `delete`), is parsed to the same
//! name, and both forms pick the same shard from the tenant id. A tenant's
//! name ([`TenantName`]) carries its id's hash, worked out once: the shard
//! and the tenant's place in its prefix's table both come from it.

use std::sync::{Mutex, OnceLock};

use super::{hashed_shard, tenant_hash};
use crate::cache::MAX_PREFIX_LEN;

/// How many prefixes a cache interns; the prefixes after them are named by
/// their keys, as any other key.
const PREFIXES: usize = 64;

/// A series' name within a shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Name<'k> {
    /// A limiter tenant.
    Tenant(TenantName),
    /// Any other key.
    Text(&'k str),
}

/// A limiter tenant's series name: its interned prefix's id and the
/// tenant's id, with the id's hash worked out once — its high bits pick the
/// shard, and the rest find the tenant in its prefix's table
/// (`tenants.rs`), so one decision hashes the id once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct TenantName {
    /// The interned prefix's id.
    pub(super) prefix: u32,
    /// The tenant's id.
    pub(super) tenant: u128,
    /// `tenant_hash(tenant)`.
    hash: u64,
}

impl TenantName {
    /// `tenant` under the prefix whose id is `prefix`.
    #[inline]
    pub(super) fn new(prefix: u32, tenant: u128) -> Self {
        TenantName {
            prefix,
            tenant,
            hash: tenant_hash(tenant),
        }
    }

    /// The shard the tenant's series lives on (as `shard_of_tenant`).
    #[inline]
    pub(super) fn shard(&self) -> usize {
        hashed_shard(self.hash)
    }

    /// The tenant's id, hashed.
    #[inline]
    pub(super) fn hash(&self) -> u64 {
        self.hash
    }
}

/// The interned prefixes: filled in order, never emptied.
pub(super) struct Prefixes {
    slots: [OnceLock<Box<str>>; PREFIXES],
    /// Held while a prefix is added, so one prefix never gets two ids.
    adding: Mutex<()>,
}

impl Default for Prefixes {
    fn default() -> Self {
        Prefixes {
            slots: std::array::from_fn(|_| OnceLock::new()),
            adding: Mutex::new(()),
        }
    }
}

impl Prefixes {
    /// `prefix`'s id, interning it if there is room; `None` once the table is
    /// full, for a prefix no limiter accepts, and for one that begins with a
    /// hash tag (`{`: its keys live on the tagged shard, by their text).
    #[inline]
    pub(super) fn id(&self, prefix: &str) -> Option<u32> {
        // Only `intern` checks the prefix: one it refused is never found.
        self.find(prefix).or_else(|| self.intern(prefix))
    }

    /// Adds `prefix`, unless another thread just did, the table is full, or
    /// no prefix of that form is named by id.
    #[cold]
    fn intern(&self, prefix: &str) -> Option<u32> {
        if prefix.is_empty() || prefix.len() > MAX_PREFIX_LEN || prefix.starts_with('{') {
            return None;
        }
        // A full table stays full: the prefixes after it are named by their
        // keys on every call, without taking the lock each time.
        if self.slots[PREFIXES - 1].get().is_some() {
            return None;
        }
        let _adding = self.adding.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(id) = self.find(prefix) {
            return Some(id);
        }
        let free = self.slots.iter().position(|slot| slot.get().is_none())?;
        let _ = self.slots[free].set(Box::from(prefix));
        u32::try_from(free).ok()
    }

    /// `prefix`'s id, if it is interned.
    #[inline]
    fn find(&self, prefix: &str) -> Option<u32> {
        for (id, slot) in self.slots.iter().enumerate() {
            match slot.get() {
                Some(known) if same(known.as_bytes(), prefix.as_bytes()) => return u32::try_from(id).ok(),
                Some(_) => {}
                // Filled in order: nothing after an empty slot.
                None => return None,
            }
        }
        None
    }

    /// The name `key` has: a tenant's when it is `{prefix}:{tenant}` with an
    /// interned (or internable) prefix, else the key itself.
    pub(super) fn name<'k>(&self, key: &'k str) -> Name<'k> {
        match tenant_key(key).and_then(|(prefix, tenant)| Some((self.id(prefix)?, tenant))) {
            Some((id, tenant)) => Name::Tenant(TenantName::new(id, tenant)),
            None => Name::Text(key),
        }
    }
}

/// Whether two prefixes are the same bytes. Every `acquire` asks this of
/// its limiter's prefix: a prefix of 8 to 16 bytes (`kg:ratelimit`) is two
/// overlapping word compares here, where `==` calls `memcmp`.
#[inline]
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    match (
        a.first_chunk::<8>(),
        b.first_chunk::<8>(),
        a.last_chunk::<8>(),
        b.last_chunk::<8>(),
    ) {
        (Some(a_head), Some(b_head), Some(a_tail), Some(b_tail)) if a.len() <= 16 => {
            a_head == b_head && a_tail == b_tail
        }
        _ => a == b,
    }
}

/// Length of a hyphenated UUID.
const UUID_LEN: usize = 36;

/// `key` split as `{prefix}:{tenant}` — a non-empty prefix that does not begin
/// with `{`, a colon, and a UUID in hyphenated lower-case hex, exactly as a
/// limiter formats it — or `None`.
pub(super) fn tenant_key(key: &str) -> Option<(&str, u128)> {
    let split = key.len().checked_sub(UUID_LEN + 1)?;
    if split == 0 || key.starts_with('{') || key.as_bytes()[split] != b':' {
        return None;
    }
    let uuid = &key.as_bytes()[split + 1..];
    let mut bits = 0u128;
    for (at, byte) in uuid.iter().enumerate() {
        if matches!(at, 8 | 13 | 18 | 23) {
            if *byte != b'-' {
                return None;
            }
            continue;
        }
        let digit = match byte {
            b'0'..=b'9' => byte - b'0',
            b'a'..=b'f' => byte - b'a' + 10,
            _ => return None,
        };
        bits = (bits << 4) | u128::from(digit);
    }
    // `split` is the colon's index, an ASCII byte: a character boundary.
    Some((key.get(..split)?, bits))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::KeyBuf;
    use crate::tenant::TenantId;

    #[test]
    fn a_limiters_key_parses_back_to_its_prefix_and_tenant() {
        for n in [0u128, 1, u128::MAX, 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210] {
            let key = KeyBuf::tenant("kg:ratelimit", &TenantId::from_u128(n));
            assert_eq!(tenant_key(key.as_str()), Some(("kg:ratelimit", n)));
        }
    }

    #[test]
    fn other_keys_are_not_tenants() {
        let tenant = "00000000-0000-0000-0000-000000000001";
        for key in [
            tenant.to_owned(),
            format!(":{tenant}"),
            format!("{{p}}:{tenant}"),
            format!("p:{}", tenant.to_uppercase().replace('0', "A")),
            format!("p;{tenant}"),
            format!("p:{}", tenant.replace('-', "0")),
            "short".to_owned(),
        ] {
            assert_eq!(tenant_key(&key), None, "{key}");
        }
    }

    #[test]
    fn a_prefix_gets_one_id_and_the_table_fills_for_good() {
        let prefixes = Prefixes::default();
        assert_eq!(prefixes.id("a"), Some(0));
        assert_eq!(prefixes.id("b"), Some(1));
        assert_eq!(prefixes.id("a"), Some(0));
        for n in 2..PREFIXES {
            assert_eq!(prefixes.id(&format!("p{n}")), u32::try_from(n).ok());
        }
        assert_eq!(prefixes.id("one too many"), None);
        assert_eq!(prefixes.id("b"), Some(1));
        let key = format!("one too many:{}", TenantId::from_u128(3));
        assert_eq!(prefixes.name(&key), Name::Text(&key));
    }

    #[test]
    fn prefixes_are_the_same_exactly_when_their_bytes_are() {
        let base: Vec<u8> = (0..40u8).map(|n| b'a' + n % 26).collect();
        for len in 0..=base.len() {
            let a = &base[..len];
            assert!(same(a, a), "{len}");
            for at in 0..len {
                let mut b = a.to_vec();
                b[at] ^= 1;
                assert!(!same(a, &b), "{len} bytes, differing at {at}");
            }
            assert!(!same(a, &base[..len.saturating_sub(1)]) || len == 0);
        }
    }

    #[test]
    fn a_tagged_prefix_is_never_interned() {
        let prefixes = Prefixes::default();
        assert_eq!(prefixes.id("{kg}"), None);
        assert_eq!(prefixes.id("kg"), Some(0));
    }
}
