//! The template's binary starts and shows the standard plugin flags. (Its
//! NRI behaviour is tested under nri-replay in `replay/tests/replay.rs`,
//! which needs this binary built: an integration test here makes
//! `cargo test --workspace` build it.)

#[test]
fn help_shows_the_plugin_flags() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nri-plugin-template"))
        .arg("--help")
        .output()
        .expect("run nri-plugin-template --help");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for flag in ["--socket-path", "--idx", "--name"] {
        assert!(text.contains(flag), "no {flag} in:\n{text}");
    }
}
