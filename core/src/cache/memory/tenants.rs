//! A shard's limiter tenants that hold no slot (`slots.rs`: the tenants
//! placed when their probe's slots were all live, who stay until they
//! expire and are swept, or are deleted): each
//! tenant's series found, under the shard's lock, by its prefix's id and
//! its tenant id, with the series' header and the id on one cache line.
//!
//! Over many tenants each decision finds its tenant's entry out of cache,
//! and the entry is read before anything else can start: a map keyed by
//! `(prefix, tenant)` held a 96-byte entry that straddles two or three
//! lines. Here each prefix has its own table (so the prefix is not stored),
//! and an entry — the 16-byte id and the 48-byte series header — is one
//! aligned 64-byte line (the series' buffer is a ring whose header is 32
//! bytes, `ring.rs`). The hits themselves are where the buffer keeps them.

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;

use super::names::TenantName;
use super::series::Series;
use super::tenant_hash;

/// One tenant's series, beside its id, on a cache line of its own.
#[repr(align(64))]
pub(super) struct TenantSeries {
    tenant: u128,
    series: Series,
}

// The point of the layout: one entry, one line.
const _: () = assert!(size_of::<TenantSeries>() == 64);

/// The tenants' series of one shard, by prefix id and tenant id.
///
/// The first prefix's table is held inline, first (`repr(C)`): a cache
/// owned by one limiter — the common case — finds its table on the shard's
/// first line, with no load through a vector's buffer.
#[repr(C)]
#[derive(Default)]
pub(super) struct Tenants {
    /// The table of prefix id 0.
    first: HashTable<TenantSeries>,
    /// The tables of prefix ids 1 and on (at most 63 of them), at id − 1.
    rest: Vec<HashTable<TenantSeries>>,
    /// Series held over every table.
    len: usize,
}

/// The hash a tenant's entry is found by in its table, from its id's
/// hash: the hash whose high bits chose the shard (`shard_of_tenant`),
/// rotated — within one shard those bits are all alike, and the table's
/// tags come from its high bits.
fn table_hash(tenant_hash: u64) -> u64 {
    tenant_hash.rotate_left(32)
}

/// An entry's table hash, from its id (for the table to move it).
fn entry_hash(entry: &TenantSeries) -> u64 {
    table_hash(tenant_hash(entry.tenant))
}

impl Tenants {
    /// How many series are held, live or expired.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Where the table of prefix id 0 is: what a decision reads first.
    #[cfg(test)]
    pub(super) fn first_table(&self) -> (usize, usize) {
        (
            &self.first as *const HashTable<TenantSeries> as usize,
            size_of::<HashTable<TenantSeries>>(),
        )
    }

    /// The table of prefix id `prefix`, if it has one.
    #[inline]
    fn table_mut(&mut self, prefix: u32) -> Option<&mut HashTable<TenantSeries>> {
        match prefix {
            0 => Some(&mut self.first),
            _ => self.rest.get_mut(prefix as usize - 1),
        }
    }

    /// The series named `name`, if one is held.
    #[inline]
    pub(super) fn get_mut(&mut self, name: TenantName) -> Option<&mut Series> {
        let table = self.table_mut(name.prefix)?;
        table
            .find_mut(table_hash(name.hash()), |e| e.tenant == name.tenant)
            .map(|e| &mut e.series)
    }

    /// The table of prefix id `prefix`, made (with those before it) if it
    /// has none.
    fn table_or_new(&mut self, prefix: u32) -> &mut HashTable<TenantSeries> {
        let Some(at) = (prefix as usize).checked_sub(1) else {
            return &mut self.first;
        };
        if self.rest.len() <= at {
            self.rest.resize_with(at + 1, HashTable::new);
        }
        &mut self.rest[at]
    }

    /// Every table, prefix id 0 first.
    fn tables(&self) -> impl Iterator<Item = &HashTable<TenantSeries>> {
        std::iter::once(&self.first).chain(&self.rest)
    }

    /// Stores `series` as the one named `name`, replacing any held.
    pub(super) fn insert(&mut self, name: TenantName, series: Series) {
        let table = self.table_or_new(name.prefix);
        let held = |e: &TenantSeries| e.tenant == name.tenant;
        match table.entry(table_hash(name.hash()), held, entry_hash) {
            Entry::Occupied(mut entry) => entry.get_mut().series = series,
            Entry::Vacant(entry) => {
                entry.insert(TenantSeries {
                    tenant: name.tenant,
                    series,
                });
                self.len += 1;
            }
        }
    }

    /// Forgets the series named `name`.
    pub(super) fn remove(&mut self, name: TenantName) {
        let Some(table) = self.table_mut(name.prefix) else {
            return;
        };
        if let Ok(entry) = table.find_entry(table_hash(name.hash()), |e| e.tenant == name.tenant) {
            entry.remove();
            self.len -= 1;
        }
    }

    /// Keeps only the series `keep` says to.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&Series) -> bool) {
        for table in std::iter::once(&mut self.first).chain(&mut self.rest) {
            table.retain(|e| keep(&e.series));
        }
        self.len = self.tables().map(HashTable::len).sum();
    }

    /// Every series held.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Series> {
        self.tables().flat_map(|table| table.iter().map(|e| &e.series))
    }

    /// Forgets every series, and frees the tables.
    pub(super) fn clear(&mut self) {
        self.first = HashTable::new();
        self.rest = Vec::new();
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::time::Timestamp;

    fn series(at: u64) -> Series {
        Series::first(
            Timestamp::from_secs(at),
            Duration::from_secs(100),
            Timestamp::from_secs(at),
        )
        .unwrap()
    }

    fn first_hit(tenants: &mut Tenants, prefix: u32, tenant: u128) -> Option<(u64, Option<Timestamp>)> {
        tenants
            .get_mut(TenantName::new(prefix, tenant))
            .map(|s| s.window(Timestamp::EPOCH))
    }

    #[test]
    fn a_tenant_is_found_under_its_own_prefix_only_and_counted_once() {
        let mut tenants = Tenants::default();
        tenants.insert(TenantName::new(3, 7), series(1));
        tenants.insert(TenantName::new(0, 7), series(2));
        tenants.insert(TenantName::new(3, 8), series(3));
        assert_eq!(tenants.len(), 3);
        assert_eq!(first_hit(&mut tenants, 3, 7), Some((1, Some(Timestamp::from_secs(1)))));
        assert_eq!(first_hit(&mut tenants, 0, 7), Some((1, Some(Timestamp::from_secs(2)))));
        assert_eq!(first_hit(&mut tenants, 1, 7), None);
        assert_eq!(first_hit(&mut tenants, 9, 7), None);
        // Replacing keeps one entry.
        tenants.insert(TenantName::new(3, 7), series(4));
        assert_eq!(tenants.len(), 3);
        assert_eq!(first_hit(&mut tenants, 3, 7), Some((1, Some(Timestamp::from_secs(4)))));
        tenants.remove(TenantName::new(3, 7));
        tenants.remove(TenantName::new(3, 7));
        tenants.remove(TenantName::new(40, 7));
        assert_eq!(tenants.len(), 2);
        assert_eq!(first_hit(&mut tenants, 3, 7), None);
        tenants.retain(|s| s.deadline > Timestamp::from_secs(102));
        assert_eq!(tenants.len(), 1);
        assert_eq!(tenants.iter().count(), 1);
        assert_eq!(first_hit(&mut tenants, 3, 8), Some((1, Some(Timestamp::from_secs(3)))));
        tenants.clear();
        assert_eq!((tenants.len(), tenants.iter().count()), (0, 0));
    }

    #[test]
    fn clearing_frees_every_table() {
        let mut tenants = Tenants::default();
        tenants.insert(TenantName::new(0, 7), series(1));
        tenants.insert(TenantName::new(2, 7), series(1));
        let room: Vec<bool> = tenants.tables().map(|t| t.capacity() > 0).collect();
        assert_eq!(room, [true, false, true], "tables 0 and 2 hold a series");
        tenants.clear();
        // `HashTable::clear` would keep the buckets: a closed cache would hold them.
        let room: Vec<usize> = tenants.tables().map(HashTable::capacity).collect();
        assert_eq!(room, [0], "the first table's room, and no other table");
    }

    #[test]
    fn many_tenants_of_one_shard_stay_apart() {
        // Ids the cache would put on one shard: their hashes' high bits agree.
        let ids: Vec<u128> = (0..200_000u128)
            .filter(|id| super::super::shard_of_tenant(*id) == 1)
            .take(3_000)
            .collect();
        assert_eq!(ids.len(), 3_000);
        let mut tenants = Tenants::default();
        for (n, id) in (0u64..).zip(&ids) {
            tenants.insert(TenantName::new(0, *id), series(n));
        }
        assert_eq!(tenants.len(), ids.len());
        for (n, id) in (0u64..).zip(&ids) {
            assert_eq!(
                first_hit(&mut tenants, 0, *id),
                Some((1, Some(Timestamp::from_secs(n))))
            );
        }
    }
}
