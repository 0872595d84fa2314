//! What the example tests share: the example executables they run.

use std::path::PathBuf;
use std::process::Stdio;

/// The executable of the example `name`: the one `cargo test` built beside this test (it builds every
/// example), when it is newer than every source it is made of; else built here, as
/// `cargo build --example NAME` does (cargo builds an integration test's package binaries
/// for it, not its examples, and a build of one package alone may resolve other features and
/// rebuild half the dependencies).
pub(crate) fn example_binary(name: &str) -> PathBuf {
    built_by_cargo_test(name).unwrap_or_else(|| build_example(name))
}

/// The newest `NAME-<hash>` executable in this profile's `examples/` directory, if it is
/// newer than the example's sources and the runtime's.
fn built_by_cargo_test(name: &str) -> Option<PathBuf> {
    let profile = std::env::current_exe()
        .ok()?
        .parent()?
        .parent()?
        .to_path_buf();
    let modified = |path: &std::path::Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let (newest, built) = std::fs::read_dir(profile.join("examples"))
        .ok()?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|file| {
                    file.strip_prefix(name)
                        .and_then(|rest| rest.strip_prefix('-'))
                        .is_some_and(|hash| !hash.contains('.') && !hash.contains('-'))
                })
        })
        .filter_map(|path| Some((modified(&path)?, path)))
        .max()?;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent()?;
    let sources = ["examples", "distlock-runtime/src", "distlock-macros/src"];
    let mut stack: Vec<PathBuf> = sources.iter().map(|dir| root.join(dir)).collect();
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            let entries = std::fs::read_dir(&path).ok()?;
            stack.extend(entries.filter_map(Result::ok).map(|entry| entry.path()));
        } else if modified(&path)? > newest {
            return None;
        }
    }
    Some(built)
}

/// Builds the example and returns its path.
fn build_example(name: &str) -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut build = std::process::Command::new(cargo);
    build
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["build", "-p", "distlock-examples", "--example", name])
        .args(["--message-format", "json-render-diagnostics"])
        .stderr(Stdio::inherit());
    if !cfg!(debug_assertions) {
        build.arg("--release");
    }
    let output = build.output().expect("run cargo build --example");
    assert!(
        output.status.success(),
        "cargo build --example {name} failed"
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| {
            message["reason"] == "compiler-artifact" && message["target"]["name"] == name
        })
        .find_map(|message| message["executable"].as_str().map(PathBuf::from))
        .expect("cargo named the example's executable")
}
