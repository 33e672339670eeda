//! The generic merges of the adjustment shapes with `-key` removals: maps
//! (annotations, sysctl, net devices) and keyed lists (env by name, mounts
//! by destination, devices by path).

use std::collections::{BTreeMap, HashMap};

use nri_proto::api::Field;

use crate::{result::MergeError, result::owners::Records};

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

/// Map with `-key` removals, merged from one plugin: each set key (in
/// sorted order) is claimed and written to the container `ctr` and the
/// reply; a key both removed and set first clears its ownership to the
/// plugin (which then takes it over) and reaches the reply as `-key` too.
/// A removal-only key reaches the reply as a `-key` marker and leaves
/// ownership and the container alone (upstream).
pub(crate) fn merge_map<V: Clone + Default>(
    own: &mut (impl Records + ?Sized),
    field: Field,
    plugin: &str,
    adj: HashMap<String, V>,
    ctr: &mut HashMap<String, V>,
    reply: &mut HashMap<String, V>,
) -> Result<(), MergeError> {
    if adj.is_empty() {
        return Ok(());
    }
    // Vectors, not sorted maps: an answer has a few keys, and a map's node
    // costs more than sorting them. The keys of `adj` are unique, so the
    // sorted sets have no ties; removals keep their `-`.
    let mut dels: Vec<String> = Vec::new();
    let mut sets: Vec<(String, V)> = Vec::with_capacity(adj.len());
    for (k, v) in adj {
        if removal_key(&k).is_some() {
            dels.push(k);
        } else {
            sets.push((k, v));
        }
    }
    sets.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    for (k, v) in sets {
        if let Some(i) = dels.iter().position(|d| d[1..] == *k) {
            own.clear_compound(field, &k, plugin);
            ctr.remove(&k);
            reply.insert(dels.swap_remove(i), V::default());
        }
        own.claim_compound(field, &k, plugin)?;
        ctr.insert(k.clone(), v.clone());
        reply.insert(k, v);
    }
    for d in dels {
        reply.insert(d, V::default());
    }
    Ok(())
}

/// How [`merge_keyed`] reads and writes one keyed list.
pub(crate) struct Keyed<T, C> {
    /// The ownership record.
    pub field: Field,
    /// An entry's key (`-key` for a removal).
    pub key: fn(&T) -> &str,
    /// Whether a container entry has the key (`key` never starts with
    /// `-`). A predicate rather than the entry's key: for env it settles
    /// most entries by one byte instead of a search for `=`.
    pub ctr_has: fn(&C, &str) -> bool,
    /// The container's form of an entry.
    pub to_ctr: fn(&T) -> C,
}

/// Keyed list with `-key` removals (env, mounts, devices), merged from one
/// plugin. A removal drops the entries earlier plugins put in the reply
/// (clearing their ownership to this plugin) and the container's entry;
/// each added entry is claimed and replaces the container's entry of its
/// key. A removal not re-added in the same response reaches the reply as a
/// marker (once), so the runtime drops an entry of the original spec too.
pub(crate) fn merge_keyed<T: Clone, C>(
    own: &mut (impl Records + ?Sized),
    k: &Keyed<T, C>,
    plugin: &str,
    items: Vec<T>,
    reply: &mut Vec<T>,
    ctr: &mut Vec<C>,
) -> Result<(), MergeError> {
    if items.is_empty() {
        return Ok(());
    }
    // The additions stay in the answer's own vector (most answers remove
    // nothing, and a second vector per field is an allocation per answer).
    let mut add = items;
    let mut del = BTreeMap::new();
    if add.iter().any(|it| removal_key((k.key)(it)).is_some()) {
        let mut kept = Vec::with_capacity(add.len());
        for it in add {
            match removal_key((k.key)(&it)) {
                Some(key) => {
                    del.insert(key.to_string(), it);
                }
                None => kept.push(it),
            }
        }
        add = kept;
    }
    if !del.is_empty() {
        reply.retain(|x| {
            let removed = del.contains_key((k.key)(x));
            if removed {
                own.clear_compound(k.field, (k.key)(x), plugin);
            }
            !removed
        });
    }
    let readded = |key: &str| add.iter().any(|x| (k.key)(x) == key);
    let replaced = |c: &C| del.keys().any(|d| (k.ctr_has)(c, d)) || add.iter().any(|x| (k.ctr_has)(c, (k.key)(x)));
    ctr.retain(|c| !replaced(c));
    for x in &add {
        own.claim_compound(k.field, (k.key)(x), plugin)?;
    }
    let markers: Vec<T> = del
        .into_iter()
        .filter(|(key, m)| !readded(key) && !reply.iter().any(|x| (k.key)(x) == (k.key)(m)))
        .map(|(_, m)| m)
        .collect();
    ctr.reserve(add.len());
    ctr.extend(add.iter().map(k.to_ctr));
    reply.extend(add);
    reply.extend(markers);
    Ok(())
}
