//! Compile-time behaviour of `#[distributed_lock]`: every error message (tests/ui/fail, each
//! with its `.stderr`) and every supported form (tests/ui/pass).

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("ui/fail/*.rs");
    cases.pass("ui/pass/*.rs");
}
