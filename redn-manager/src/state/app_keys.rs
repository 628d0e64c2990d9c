//! The numbers app rules are known by to their remote clients ([`AppKeys`]).

use std::collections::HashMap;

/// The numbers app rules are known by in a remote client's identity
/// ([`crate::auditor::ClientId`]), by name and the processes the rule is for.
///
/// Why the matchers too: a remote client's budgets, throttle and ban belong to the app it
/// reached. A reload that gives a rule's name to other processes (other `uid`, `gid`, `exe`
/// or `cgroup`) makes it another tenant's rule, whose remote clients must not inherit what
/// the old tenant's clients did; so the name then gets a new number. A number is never
/// given twice.
#[derive(Debug, Default)]
pub(super) struct AppKeys {
    by_name: HashMap<String, (redn_policy::Matchers, crate::auditor::AppKey)>,
    /// The name of every number given (one entry per rule a reload changed: bounded by
    /// the operator's reloads, not by clients).
    names: HashMap<crate::auditor::AppKey, String>,
    next: u64,
}

impl AppKeys {
    /// The number of the rule named `name` for the processes `matchers` select.
    pub(super) fn key(
        &mut self,
        name: &str,
        matchers: &redn_policy::Matchers,
    ) -> crate::auditor::AppKey {
        if let Some((m, key)) = self.by_name.get(name) {
            if m == matchers {
                return *key;
            }
        }
        let key = crate::auditor::AppKey(self.next);
        self.next += 1;
        self.by_name
            .insert(name.to_owned(), (matchers.clone(), key));
        self.names.insert(key, name.to_owned());
        key
    }

    /// The name of the rule numbered `key`, now or before a reload.
    pub(super) fn name_of(&self, key: crate::auditor::AppKey) -> Option<&str> {
        self.names.get(&key).map(String::as_str)
    }

    /// Every number the name `name` has had, in order.
    pub(super) fn keys_named(&self, name: &str) -> Vec<crate::auditor::AppKey> {
        let mut keys: Vec<_> = self
            .names
            .iter()
            .filter(|(_, n)| n.as_str() == name)
            .map(|(k, _)| *k)
            .collect();
        keys.sort();
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_app_rule_given_to_other_processes_is_another_app_for_remote_clients() {
        let mut keys = AppKeys::default();
        let of = |uid| {
            let mut m = redn_policy::Matchers::default();
            m.uid = Some(uid);
            m
        };
        let kv = keys.key("kv", &of(1000));
        assert_eq!(
            keys.key("kv", &of(1000)),
            kv,
            "the same rule keeps its number"
        );
        let other = keys.key("cache", &of(1000));
        assert_ne!(other, kv, "another name, another number");
        let moved = keys.key("kv", &of(2000));
        assert!(
            moved != kv && moved != other,
            "a reload gave kv to uid 2000"
        );
        let back = keys.key("kv", &of(1000));
        assert!(
            ![kv, other, moved].contains(&back),
            "given back to uid 1000 it is a new app again: numbers are never reused"
        );
        for (key, name) in [(kv, "kv"), (other, "cache"), (moved, "kv"), (back, "kv")] {
            assert_eq!(keys.name_of(key), Some(name), "every number keeps its name");
        }
        assert_eq!(keys.keys_named("kv"), [kv, moved, back]);
        assert_eq!(keys.keys_named("cache"), [other]);
        assert_eq!(keys.keys_named("none"), []);
        assert_eq!(keys.name_of(crate::auditor::AppKey(99)), None);
    }
}
