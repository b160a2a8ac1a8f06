//! The `tollgate` command line as a user sees it: `--help` of the binary and
//! of every subcommand, snapshot-tested with trycmd (`tests/cmd/*.md`; after
//! a deliberate change, regenerate with `TRYCMD=overwrite cargo test -p
//! tollgate-server --test cli_ui`).

#[test]
fn cli_ui() {
    trycmd::TestCases::new()
        .register_bin(
            "tollgate",
            std::path::Path::new(env!("CARGO_BIN_EXE_tollgate")),
        )
        .case("tests/cmd/*.md");
}
