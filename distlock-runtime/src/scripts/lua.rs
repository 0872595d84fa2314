//! A Lua script as Redis runs it ([`Lua`]: its text and SHA-1), and the macros that compose
//! one at compile time from this crate's `.lua` files.

/// A Lua script: its source (composed at compile time, see `scripts/`) and its SHA-1, which
/// `EVALSHA` names it by.
pub(crate) struct Lua {
    code: &'static str,
    hash: String,
}

impl Lua {
    pub(crate) fn new(code: &'static str) -> Self {
        let hash = sha1_smol::Sha1::from(code.as_bytes()).digest().to_string();
        Self { code, hash }
    }

    /// The script's source, as Redis runs it (line numbers in its errors count from here).
    pub(crate) fn code(&self) -> &'static str {
        self.code
    }

    /// The script's SHA-1 in hex, as `EVALSHA` names it.
    pub(crate) fn hash(&self) -> &str {
        &self.hash
    }
}

/// A script's text, composed at compile time: `first_line` (`#!lua` and its flags), then the
/// named files of this folder in order, the shared functions before the script that calls
/// them. Without a first line, a script is run without flags, as Redis ran scripts before 7.0.
macro_rules! lua {
    ($first_line:literal; $($file:literal),+ $(,)?) => {
        concat!($first_line, "\n", $crate::scripts::lua!($($file),+))
    };
    ($($file:literal),+ $(,)?) => {
        concat!($(include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/", $file))),+)
    };
}
pub(crate) use lua;

/// [`lua!`] for a script that needs shared functions (the text of their files, composed by
/// [`lua!`]) in one branch only: they are put in place of the marker `at` (a Lua comment, such
/// as `--[[ queue functions ]]`), which
/// must occur exactly once in the script, instead of before the script. A run of the script
/// that does not reach that branch creates none of their closures. Several `at marker; shared`
/// pairs, separated by commas, splice in turn.
macro_rules! lua_spliced {
    ($first_line:literal; $($script:literal),+ $(at $marker:literal; $shared:expr),+ $(,)?) => {
        $crate::scripts::lua::spliced!(
            $crate::scripts::lua!($first_line; $($script),+);
            $($marker => $shared),+
        )
    };
}
pub(crate) use lua_spliced;

/// `script` (an expression a `const` can hold) with each `shared` in place of its `marker`, in
/// turn: [`lua_spliced!`]'s work.
macro_rules! spliced {
    ($script:expr; $marker:literal => $shared:expr $(, $markers:literal => $shareds:expr)*) => {
        $crate::scripts::lua::spliced!({
            const SCRIPT: &str = $script;
            const SHARED: &str = $shared;
            const MARKER: &str = $marker;
            const BYTES: [u8; SCRIPT.len() - MARKER.len() + SHARED.len()] =
                $crate::scripts::lua::splice(SCRIPT, MARKER, SHARED);
            const TEXT: &str = match ::core::str::from_utf8(&BYTES) {
                Ok(text) => text,
                Err(_) => panic!("a spliced script is not UTF-8"),
            };
            TEXT
        }; $($markers => $shareds),*)
    };
    ($script:expr;) => {
        $script
    };
}
pub(crate) use spliced;

/// `script` with `shared` in place of `marker`, which occurs exactly once in it (else the
/// build fails); `N` is the result's length. For [`lua_spliced!`], at compile time.
pub(crate) const fn splice<const N: usize>(script: &str, marker: &str, shared: &str) -> [u8; N] {
    let (script, marker, shared) = (script.as_bytes(), marker.as_bytes(), shared.as_bytes());
    assert!(N + marker.len() == script.len() + shared.len());
    let at = find_once(script, marker);
    let mut spliced = [0; N];
    let mut i = 0;
    while i < N {
        spliced[i] = if i < at {
            script[i]
        } else if i < at + shared.len() {
            shared[i - at]
        } else {
            script[i - shared.len() + marker.len()]
        };
        i += 1;
    }
    spliced
}

/// Where `part` starts in `text`, where it occurs exactly once.
const fn find_once(text: &[u8], part: &[u8]) -> usize {
    let mut found = None;
    let mut i = 0;
    while i + part.len() <= text.len() {
        let mut j = 0;
        while j < part.len() && text[i + j] == part[j] {
            j += 1;
        }
        if j == part.len() {
            assert!(
                found.is_none(),
                "the splice marker occurs twice in the script"
            );
            found = Some(i);
        }
        i += 1;
    }
    match found {
        Some(at) => at,
        None => panic!("the splice marker is missing from the script"),
    }
}
