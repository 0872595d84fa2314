//! What the `distlock` test files share.

/// The keys of the rows `distlock --json list` printed, sorted here: the tool orders them by
/// their Redis names, where `k-1}` comes after `k-10}`
/// (`inspection::held_locks_are_sorted_by_key`).
pub(crate) fn sorted_keys(rows: &serde_json::Value) -> Vec<String> {
    let mut keys: Vec<String> = rows
        .as_array()
        .unwrap_or_else(|| panic!("list printed {rows}"))
        .iter()
        .map(|row| row["key"].as_str().unwrap().to_owned())
        .collect();
    keys.sort();
    keys
}
