//! Every Lua script the runtime sends, whichever module builds its calls: the list that
//! `__private` hands the scripts' own tests, and whose SHA1s are pinned here so that an
//! accidental change to a script's text shows.

use crate::scripts::{self, Lua};

/// Every script distlock sends, by the name of its file (without `.lua`).
pub(crate) fn all() -> [(&'static str, &'static Lua); 9] {
    [
        ("acquire", &scripts::ACQUIRE),
        ("release", &scripts::RELEASE),
        ("extend", &scripts::EXTEND),
        ("fair_acquire", &crate::fair::ACQUIRE_FAIR),
        ("raise", &crate::fence::RAISE),
        ("inspect", &crate::inspect::INSPECT),
        ("force_release", &crate::inspect::FORCE_RELEASE),
        ("check", &crate::diagnose::CHECK),
        ("key_types", &crate::refusal::TYPES),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SHA1 of every composed script, as `EVALSHA` names it: a change to a script's text
    /// shows here, and is made on purpose.
    const PINNED: [(&str, &str); 9] = [
        ("acquire", "26122cd3198bac0aa9e56ccad111b823bda9e749"),
        ("release", "5da3b59f3e348f7d19bb48e96cc5606b850b8b25"),
        ("extend", "4842bb4b1e7ff5d8764a5c04d5a5eabda64d1143"),
        ("fair_acquire", "cbe3f379fc725cf7d5e215d1c4ae166c1f5f6c5b"),
        ("raise", "ae177c3820fd89219691cdc41181d774fa6ba1f1"),
        ("inspect", "a2b69aa5c946b9f34820d699131af119bc5d9ce8"),
        ("force_release", "bfd84384e0433439942209b3464227507f3de6a7"),
        ("check", "7a1905a9b3b1fad732ec7c809c11de91bdd30380"),
        ("key_types", "00d627e5d25e9f0a0926f15eacbf237f1e0a175d"),
    ];

    #[test]
    fn every_composed_script_has_its_pinned_sha1() {
        let scripts = all();
        let changed: Vec<String> = scripts
            .iter()
            .filter(|(name, lua)| !PINNED.contains(&(*name, lua.hash())))
            .map(|(name, lua)| format!("(\"{name}\", \"{}\"),", lua.hash()))
            .collect();
        assert!(
            changed.is_empty(),
            "the composed text of these scripts changed (a `.lua` file they are made of, or \
             their composition). If that was on purpose, run `cargo test -p distlock-tests \
             --test scripts`, then set their pins in `PINNED` (distlock-runtime/src/\
             catalog.rs) to:\n{}",
            changed.join("\n")
        );
        for (name, _) in PINNED {
            assert!(
                scripts.iter().any(|(script, _)| *script == name),
                "`PINNED` names `{name}`, which `all()` does not list"
            );
        }
    }

    #[test]
    fn the_first_line_stays_first_and_no_splice_marker_is_left() {
        for (name, lua) in all() {
            let code = lua.code();
            assert!(
                !code.contains("#!") || code.starts_with("#!lua"),
                "{name}: a `#!` line that is not the first"
            );
            assert!(
                !code.contains("--[[ draw"),
                "{name}: a splice marker left in"
            );
        }
    }
}
