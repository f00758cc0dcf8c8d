//! Where scripts keep what outlives a call: named values (a subject's own, `state.*`, and
//! a file's, `state.of`) and named locks. One server keeps them in memory
//! ([`MemoryState`]); a cluster's heads keep them in the namespace's database, so that a
//! call through any head sees what a call through another left (the server's
//! `cluster` module implements [`StateStore`] there).

use locus_proto::types::Value;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::time::Instant;

/// Named values one subject keeps at most (`state.*`).
pub const MAX_SUBJECT_KEYS: usize = 100_000;
/// Named values one file keeps at most (`state.of`).
pub const MAX_OBJECT_KEYS: usize = 1_000;
/// Files with values attached, at most.
pub const MAX_OBJECTS: usize = 100_000;
/// Largest encoded value one named value may be set to (on a head, what a list grows
/// to by `push` too: each value is one row of the namespace).
pub const MAX_STATE_VALUE: usize = 1 << 20;

/// Whose named values: a subject's own, or a file's (by device and inode on one server,
/// by object id on a cluster), which the file's ACL governs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    Subject(String),
    Object(u64, u64),
}

impl Scope {
    /// How many named values the scope may hold.
    pub fn max_keys(&self) -> usize {
        match self {
            Scope::Subject(_) => MAX_SUBJECT_KEYS,
            Scope::Object(..) => MAX_OBJECT_KEYS,
        }
    }

    /// The refusal of a new key past [`Scope::max_keys`].
    pub fn full(&self) -> String {
        format!("state is limited to {} keys", self.max_keys())
    }
}

/// A change to one named value, made atomically: it sees the value (`None`: not set),
/// may replace or remove it, and answers what the script gets back. An `Err` changes
/// nothing and is what the script sees.
pub type Change<'a> = &'a mut (dyn FnMut(&mut Option<Value>) -> Result<Value, String> + Send);

/// What keeps scripts' values and locks.
pub trait StateStore: Send + Sync {
    /// The value of `key` in `scope`, if set.
    fn get(&self, scope: &Scope, key: &str) -> Result<Option<Value>, String>;

    /// Applies `change` to `key` in `scope` atomically; a new key past the scope's
    /// limit, or a file's first key past [`MAX_OBJECTS`] files, is refused.
    fn update(&self, scope: &Scope, key: &str, change: Change) -> Result<Value, String>;

    /// Drops every value of `scope` (its file left the namespace).
    fn forget(&self, scope: &Scope);

    /// True if some file may have values attached: only then must removals be told.
    fn watching(&self) -> bool;

    /// Takes lock `name` for `owner` (a call's token), waiting until `until`; true if
    /// taken or already held by `owner`. A lock not released by `lease` (its call's
    /// deadline) may be taken by others, as the call cannot be running any more.
    fn acquire(&self, name: &str, owner: u64, until: Instant, lease: Instant) -> bool;

    /// Releases `name` if `owner` holds it; true if it did.
    fn release(&self, name: &str, owner: u64) -> bool;

    /// True if anyone holds `name`.
    fn is_held(&self, name: &str) -> bool;

    /// How many files have values attached, where the store can count them cheaply.
    fn objects_with_state(&self) -> Option<usize> {
        None
    }
}

/// One server's values and locks, in memory.
#[derive(Default)]
pub struct MemoryState {
    values: Mutex<Values>,
    locks: Mutex<HashMap<String, u64>>,
    freed: Condvar,
}

#[derive(Default)]
struct Values {
    subjects: HashMap<String, HashMap<String, Value>>,
    objects: HashMap<(u64, u64), HashMap<String, Value>>,
}

impl Values {
    fn of(&mut self, scope: &Scope) -> Option<&mut HashMap<String, Value>> {
        match scope {
            Scope::Subject(s) => self.subjects.get_mut(s),
            Scope::Object(d, i) => self.objects.get_mut(&(*d, *i)),
        }
    }

    fn remove(&mut self, scope: &Scope) {
        match scope {
            Scope::Subject(s) => drop(self.subjects.remove(s)),
            Scope::Object(d, i) => drop(self.objects.remove(&(*d, *i))),
        }
    }
}

impl StateStore for MemoryState {
    fn get(&self, scope: &Scope, key: &str) -> Result<Option<Value>, String> {
        Ok(self.values.lock().of(scope).and_then(|v| v.get(key).cloned()))
    }

    fn update(&self, scope: &Scope, key: &str, change: Change) -> Result<Value, String> {
        let mut all = self.values.lock();
        let mut slot = all.of(scope).and_then(|v| v.remove(key));
        let was_set = slot.is_some();
        let answer = change(&mut slot);
        let Some(value) = slot else {
            if all.of(scope).is_some_and(|v| v.is_empty()) {
                all.remove(scope);
            }
            return answer;
        };
        if !was_set {
            let full = match scope {
                Scope::Subject(s) => all.subjects.get(s).is_some_and(|v| v.len() >= MAX_SUBJECT_KEYS),
                Scope::Object(d, i) => match all.objects.get(&(*d, *i)) {
                    Some(v) => v.len() >= MAX_OBJECT_KEYS,
                    None if all.objects.len() >= MAX_OBJECTS => {
                        return Err(format!("state is attached to at most {MAX_OBJECTS} files"))
                    }
                    None => false,
                },
            };
            if full {
                return Err(scope.full());
            }
        }
        let values = match scope {
            Scope::Subject(s) => all.subjects.entry(s.clone()).or_default(),
            Scope::Object(d, i) => all.objects.entry((*d, *i)).or_default(),
        };
        values.insert(key.to_string(), value);
        answer
    }

    fn forget(&self, scope: &Scope) {
        self.values.lock().remove(scope);
    }

    fn watching(&self) -> bool {
        !self.values.lock().objects.is_empty()
    }

    fn acquire(&self, name: &str, owner: u64, until: Instant, _lease: Instant) -> bool {
        let mut held = self.locks.lock();
        loop {
            match held.get(name) {
                None => {
                    held.insert(name.to_string(), owner);
                    return true;
                }
                Some(o) if *o == owner => return true,
                Some(_) => {
                    if self.freed.wait_until(&mut held, until).timed_out() && held.contains_key(name) {
                        return false;
                    }
                }
            }
        }
    }

    fn release(&self, name: &str, owner: u64) -> bool {
        let mut held = self.locks.lock();
        if held.get(name) == Some(&owner) {
            held.remove(name);
            self.freed.notify_all();
            return true;
        }
        false
    }

    fn is_held(&self, name: &str) -> bool {
        self.locks.lock().contains_key(name)
    }

    fn objects_with_state(&self) -> Option<usize> {
        Some(self.values.lock().objects.len())
    }
}

/// `state.set`: a value, or nil to remove it.
pub fn set(value: Value) -> impl FnMut(&mut Option<Value>) -> Result<Value, String> + Send {
    move |slot| {
        *slot = (value != Value::Nil).then(|| value.clone());
        Ok(Value::Nil)
    }
}

/// `state.incr`: adds `by` to an integer (unset counts as 0); answers the sum.
pub fn incr(key: &str, by: i64) -> impl FnMut(&mut Option<Value>) -> Result<Value, String> + Send + '_ {
    move |slot| {
        let now = match slot {
            Some(Value::Int(i)) => i.wrapping_add(by),
            None => by,
            Some(_) => return Err(format!("state {key:?} is not an integer")),
        };
        *slot = Some(Value::Int(now));
        Ok(Value::Int(now))
    }
}

/// `state.push`: appends to a list (unset counts as empty); answers its length.
pub fn push(key: &str, value: Value) -> impl FnMut(&mut Option<Value>) -> Result<Value, String> + Send + '_ {
    move |slot| match slot.get_or_insert_with(|| Value::List(Vec::new())) {
        Value::List(items) => {
            items.push(value.clone());
            Ok(Value::Int(items.len() as i64))
        }
        _ => Err(format!("state {key:?} is not a list")),
    }
}

/// `state.take`: removes a value and answers it.
pub fn take(slot: &mut Option<Value>) -> Result<Value, String> {
    Ok(slot.take().unwrap_or(Value::Nil))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn locks_are_exclusive_and_time_out() {
        let t = MemoryState::default();
        let soon = || Instant::now() + Duration::from_millis(20);
        assert!(t.acquire("a", 1, Instant::now(), soon()));
        assert!(t.acquire("a", 1, Instant::now(), soon()), "re-entrant for its owner");
        assert!(!t.acquire("a", 2, soon(), soon()), "another owner waits, then gives up");
        assert!(!t.release("a", 2), "only the owner releases");
        assert!(t.release("a", 1));
        assert!(t.acquire("a", 2, Instant::now(), soon()));
    }

    #[test]
    fn a_failed_change_leaves_the_value_and_limits_hold() {
        let t = MemoryState::default();
        let scope = Scope::Object(1, 2);
        t.update(&scope, "k", &mut set(Value::Str("x".into()))).unwrap();
        assert!(t.update(&scope, "k", &mut incr("k", 1)).is_err());
        assert_eq!(t.get(&scope, "k").unwrap(), Some(Value::Str("x".into())));
        for i in 1..MAX_OBJECT_KEYS {
            t.update(&scope, &format!("k{i}"), &mut set(Value::Int(1))).unwrap();
        }
        let refused = t.update(&scope, "one-more", &mut set(Value::Int(1))).unwrap_err();
        assert!(refused.contains("limited"), "{refused}");
        t.update(&scope, "k", &mut take).unwrap();
        t.update(&scope, "one-more", &mut set(Value::Int(1))).unwrap();
        t.forget(&scope);
        assert!(!t.watching());
    }
}
