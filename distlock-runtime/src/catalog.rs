//! Every Lua script the runtime sends, whichever module builds its calls: the list that
//! `__private` hands the scripts' own tests, and whose SHA1s are pinned here so that an
//! accidental change to a script's text shows.

use crate::scripts::{self, Lua};

/// Every script distlock sends, by the name of its file (without `.lua`).
pub(crate) fn all() -> [(&'static str, &'static Lua); 10] {
    [
        ("acquire", &scripts::ACQUIRE),
        ("release", &scripts::RELEASE),
        ("extend", &scripts::EXTEND),
        ("fair_acquire", &crate::fair::ACQUIRE_FAIR),
        ("fair_refresh", &crate::fair::REFRESH_FAIR),
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
    const PINNED: [(&str, &str); 10] = [
        ("acquire", "81d33536d24f7bbcc6d689c4d6b8d68652226502"),
        ("release", "2e80991ea65a0db1e61b7d9056ebb01e558b719b"),
        ("extend", "0122c43ed467ca9f37d4176f62b943d3ccd0ebfc"),
        ("fair_acquire", "bbf9cb08315c9fa8ae76308ed5f105df81c18102"),
        ("fair_refresh", "52bcf57a5866b9e1142b4fb17819257ead8545a5"),
        ("raise", "0eeb3641f21e578ad69c5fd93e1758f55dc94200"),
        ("inspect", "ab038af48ba26813a32db2c2f33cf2c319da909b"),
        ("force_release", "b5bada1b48d1460cfe22f3500ebff0da255451ce"),
        ("check", "1f2d89f62c1b0804840a95f8ce2a196067926960"),
        ("key_types", "0f78f49b3902f1c2da6260e309797d0462609281"),
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
            assert!(!code.contains("--[["), "{name}: a splice marker left in");
        }
    }
}
