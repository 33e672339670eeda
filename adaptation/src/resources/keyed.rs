//! The adjustment shapes with `-key` removals: maps (annotations, sysctl,
//! net devices) and keyed lists (env by name, mounts by destination,
//! devices by path).

use std::collections::HashMap;

/// The key a `-key` entry removes (`None` for a plain key or a bare `-`).
pub fn removal_key(key: &str) -> Option<&str> {
    key.strip_prefix('-').filter(|k| !k.is_empty())
}

/// Keyed list: puts `item` at the end, dropping the entries `same` as it.
pub fn upsert<T>(list: &mut Vec<T>, item: T, same: impl Fn(&T, &T) -> bool) {
    list.retain(|x| !same(x, &item));
    list.push(item);
}

/// Map with `-key` removals, applied to a spec's map: removals first,
/// then sets (converted by `conv`; `None` skips the key).
pub(crate) fn apply_map<V, T>(
    target: &mut Option<HashMap<String, T>>,
    adj: &HashMap<String, V>,
    conv: impl Fn(&V) -> Option<T>,
) {
    if adj.is_empty() {
        return;
    }
    let map = target.get_or_insert_with(HashMap::new);
    for k in adj.keys() {
        if let Some(key) = removal_key(k) {
            map.remove(key);
        }
    }
    for (k, v) in adj {
        if removal_key(k).is_none()
            && let Some(v) = conv(v)
        {
            map.insert(k.clone(), v);
        }
    }
}
