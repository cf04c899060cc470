//! Compile-time behaviour of `#[subscriber]`: the spec's forms compile, misuse fails with a
//! message that says what to write instead (snapshots in `ui/fail/*.stderr`).

#[test]
fn subscriber_attribute() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
