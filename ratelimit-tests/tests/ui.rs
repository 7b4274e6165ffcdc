//! Compile-time behaviour of `#[rate_limit]`: what it accepts, and the error
//! each mistake gets.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
