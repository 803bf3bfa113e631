//! Limiter keys built on the stack.
//!
//! Every `acquire` names its tenant's key, `{prefix}:{tenant}`. Formatting it
//! into a `String` would be one heap allocation per call on the hot path; a
//! fixed buffer sized for the longest prefix the limiter accepts costs none.

use crate::tenant::TenantId;

/// Longest key prefix a limiter accepts, in bytes.
pub(crate) const MAX_PREFIX_LEN: usize = 91;
const HYPHENATED_LEN: usize = 36;
const CAPACITY: usize = MAX_PREFIX_LEN + 1 + HYPHENATED_LEN;

/// `{prefix}:{tenant}` in a fixed buffer.
pub(crate) struct KeyBuf {
    len: usize,
    bytes: [u8; CAPACITY],
}

impl KeyBuf {
    /// The key for `tenant` under `prefix`. A prefix longer than
    /// [`MAX_PREFIX_LEN`] (rejected at limiter construction) is truncated at a
    /// character boundary rather than panicking.
    pub(crate) fn tenant(prefix: &str, tenant: &TenantId) -> KeyBuf {
        let mut cut = prefix.len().min(MAX_PREFIX_LEN);
        while !prefix.is_char_boundary(cut) {
            cut -= 1;
        }
        let mut bytes = [0u8; CAPACITY];
        bytes[..cut].copy_from_slice(&prefix.as_bytes()[..cut]);
        bytes[cut] = b':';
        let start = cut + 1;
        tenant
            .as_uuid()
            .hyphenated()
            .encode_lower(&mut bytes[start..start + HYPHENATED_LEN]);
        KeyBuf {
            len: start + HYPHENATED_LEN,
            bytes,
        }
    }

    /// The key.
    pub(crate) fn as_str(&self) -> &str {
        // Built from a `str` cut at a char boundary, a colon and ASCII hex.
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or("")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_prefix_colon_tenant() {
        let key = KeyBuf::tenant("kg:ratelimit", &TenantId::from_u128(1));
        assert_eq!(key.as_str(), "kg:ratelimit:00000000-0000-0000-0000-000000000001");
    }

    #[test]
    fn overlong_prefix_is_cut_at_a_char_boundary() {
        let prefix = "é".repeat(60); // 120 bytes
        let key = KeyBuf::tenant(&prefix, &TenantId::from_u128(2));
        assert!(key.as_str().ends_with(":00000000-0000-0000-0000-000000000002"));
        assert!(key.as_str().len() <= CAPACITY);
    }
}
