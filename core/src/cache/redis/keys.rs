//! Where each value lives in Redis. A value stays at its own key; a hit
//! window, a token ledger and the calls in flight each live in a sorted set
//! at a key derived from it, hash-tagged so that it lands in the key's
//! Redis Cluster slot and one script can touch both. On a cluster, a script
//! whose keys would still span slots is refused before it is sent.

/// The sorted set holding the calls in flight at `key` (a router's
/// deployment).
pub fn in_flight_key(key: &str) -> String {
    if has_hash_tag(key) || key.contains('}') {
        format!("{key}:inflight")
    } else {
        format!("{{{key}}}:inflight")
    }
}

/// The sorted set holding `key`'s token ledger: in the same hash slot as its
/// hit window, so one script can decide both on a cluster.
pub fn tokens_key(key: &str) -> String {
    if has_hash_tag(key) || key.contains('}') {
        format!("{key}:tokens")
    } else {
        format!("{{{key}}}:tokens")
    }
}

/// The sorted set holding `key`'s hit window (see `docs/redis.md`).
pub fn window_key(key: &str) -> String {
    if has_hash_tag(key) || key.contains('}') {
        format!("{key}:hits")
    } else {
        format!("{{{key}}}:hits")
    }
}

/// Whether Redis Cluster hashes `key` by a tag: a `{` followed later by a `}`
/// with at least one byte between them.
fn has_hash_tag(key: &str) -> bool {
    key.find('{')
        .and_then(|open| key[open + 1..].find('}'))
        .is_some_and(|len| len > 0)
}

/// The first two of `keys` that Redis Cluster hashes to different slots.
#[cfg(feature = "redis-cluster")]
pub(super) fn cross_slot<'a>(keys: &[&'a str]) -> Option<(&'a str, &'a str)> {
    use ::redis::cluster_routing::Slot;
    let (&first, rest) = keys.split_first()?;
    let slot = Slot::for_key(first);
    rest.iter()
        .find(|k| Slot::for_key(k) != slot)
        .map(|&other| (first, other))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_share_their_keys_slot() {
        assert_eq!(window_key("w"), "{w}:hits");
        assert_eq!(
            window_key("kg:ratelimit:00000000-0000-0000-0000-000000000001"),
            "{kg:ratelimit:00000000-0000-0000-0000-000000000001}:hits"
        );
        assert_eq!(window_key("{kg:circuit}:state"), "{kg:circuit}:state:hits");
        assert_eq!(window_key("a{b"), "{a{b}:hits");
        assert_eq!(window_key("a}b"), "a}b:hits");
        assert_eq!(window_key("{}x"), "{}x:hits");
    }

    #[cfg(feature = "redis-cluster")]
    #[test]
    fn every_script_keeps_its_keys_in_one_cluster_slot() {
        use ::redis::cluster_routing::Slot;
        // A hit window hashes with its key, whatever the key.
        for key in [
            "w",
            "kg:ratelimit:00000000-0000-0000-0000-000000000001",
            "{kg:circuit}:state",
            "a{b",
            "x{y}z",
        ] {
            assert_eq!(Slot::for_key(key), Slot::for_key(window_key(key)), "{key}");
        }
        // The breaker's seven keys share the `{prefix}` tag.
        let keys = crate::decide::breaker::BreakerKeys::new("kg:circuit:llama");
        assert_eq!(cross_slot(&keys.all()), None);
        // Keys without a common tag are caught (these two differ in slot).
        assert_eq!(cross_slot(&["a", "b"]), Some(("a", "b")));
        assert_eq!(cross_slot(&["{t}a", "{t}b", "c"]), Some(("{t}a", "c")));
    }

    #[test]
    fn hash_tags_need_content() {
        assert!(has_hash_tag("{a}b"));
        assert!(has_hash_tag("x{a}"));
        assert!(!has_hash_tag("{}a"));
        assert!(!has_hash_tag("a{b"));
        assert!(!has_hash_tag("plain"));
    }
}
