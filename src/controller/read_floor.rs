//! Reads from kube-apiserver's watch cache that are never older than what this controller has
//! already seen or written.
//!
//! A list without a resourceVersion is a consistent read: the apiserver asks etcd for its
//! current revision and, when the watch cache serves the list, waits until the cache has
//! caught up, which on an idle cluster means waiting for etcd's next progress notification
//! (up to about 100 ms, a second's tail under load). A list "not older than" a version the
//! caller names is served by the cache at once when the cache is already there. The version a
//! read must not be older than is the newest of: the object the reconcile acts on, the objects
//! of the same slot in this process's cache, and every claim write this controller made in
//! its term, so a decision never misses a write it made itself (two claims of one slot booting
//! one after the other) or one it has already observed.
//!
//! Versions are compared as numbers, which is what kube-apiserver on etcd hands out. A version
//! that is not a number, or none at all, falls back to a consistent read.
//!
//! Of the three, only this controller's own writes are known to be in the floor when it
//! matters: the process's cache may trail a write by a moment. A test can make that worst case
//! exact ([`ReadFloor::serve_exactly_for_tests`]): the cache left out and the list served at
//! exactly the floor, as a watch cache that is just there serves it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use kube::api::{ListParams, VersionMatch};

/// The newest resourceVersion this controller wrote in its term.
#[derive(Debug, Default)]
pub struct ReadFloor {
    written: AtomicU64,
    /// Tests only: lists at exactly the floor, with the cache's versions left out.
    exact: AtomicBool,
}

impl ReadFloor {
    /// Records a write's resulting resourceVersion.
    pub fn wrote(&self, resource_version: Option<&str>) {
        if let Some(version) = resource_version.and_then(|v| v.parse::<u64>().ok()) {
            self.written.fetch_max(version, Ordering::AcqRel);
        }
    }

    /// From now on, [`ReadFloor::list_params`] reads at exactly the floor of `own` and this
    /// controller's writes, leaving the cache's versions out: the oldest view the rule allows,
    /// so a test can show what the floor of its own writes alone guarantees (decisions.md,
    /// D34). The operator never calls it.
    pub fn serve_exactly_for_tests(&self) {
        self.exact.store(true, Ordering::Release);
    }

    /// List parameters that read no older than `own` (the object the reconcile acts on), every
    /// version in `cached` and every write recorded here: a cache read at the newest of them,
    /// or a consistent read when one of them is not a number or none is known.
    pub fn list_params<'a>(
        &self,
        own: Option<&'a str>,
        cached: impl IntoIterator<Item = Option<&'a str>>,
    ) -> ListParams {
        let exact = self.exact.load(Ordering::Acquire);
        let mut floor = self.written.load(Ordering::Acquire);
        let seen: Vec<Option<&str>> =
            if exact { vec![own] } else { std::iter::once(own).chain(cached).collect() };
        for version in seen {
            match version.map(str::parse::<u64>) {
                Some(Ok(version)) => floor = floor.max(version),
                // Opaque or missing: no number to stand on.
                _ => return ListParams::default(),
            }
        }
        if floor == 0 {
            return ListParams::default();
        }
        let matching = if exact { VersionMatch::Exact } else { VersionMatch::NotOlderThan };
        ListParams::default().at(&floor.to_string()).matching(matching)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(floor: &ReadFloor, seen: &[Option<&str>]) -> (Option<String>, Option<VersionMatch>) {
        let (own, cached) = seen.split_first().map_or((None, &[][..]), |(o, c)| (*o, c));
        let params = floor.list_params(own, cached.iter().copied());
        (params.resource_version, params.version_match)
    }

    #[test]
    fn the_newest_of_what_was_seen_and_written() {
        let floor = ReadFloor::default();
        let not_older = |v: &str| (Some(v.to_owned()), Some(VersionMatch::NotOlderThan));
        let consistent = (None, None);
        assert_eq!(read(&floor, &[]), consistent, "nothing known: a consistent read");
        assert_eq!(read(&floor, &[Some("120"), Some("95")]), not_older("120"));
        floor.wrote(Some("130"));
        floor.wrote(Some("125"));
        assert_eq!(read(&floor, &[Some("120")]), not_older("130"), "its own write is newer");
        assert_eq!(read(&floor, &[Some("140")]), not_older("140"));
        floor.wrote(Some("not-a-number"));
        assert_eq!(
            read(&floor, &[Some("100")]),
            not_older("130"),
            "an opaque write raises nothing"
        );
        assert_eq!(read(&floor, &[Some("140"), Some("x7")]), consistent, "opaque: consistent");
        assert_eq!(read(&floor, &[None]), consistent, "a version missing: consistent");
    }

    #[test]
    fn a_test_reads_at_exactly_its_own_floor() {
        let floor = ReadFloor::default();
        floor.serve_exactly_for_tests();
        let exactly = |v: &str| (Some(v.to_owned()), Some(VersionMatch::Exact));
        assert_eq!(read(&floor, &[Some("120"), Some("150")]), exactly("120"), "cache left out");
        floor.wrote(Some("130"));
        assert_eq!(read(&floor, &[Some("120"), Some("150")]), exactly("130"));
    }
}
