//! The binary as a user runs it: bad settings are clear errors, and a standalone
//! node starts, opens its data directory and stops cleanly on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rocketgate"))
}

#[test]
fn a_bad_setting_names_itself_and_its_origin() {
    let dir = tempfile::tempdir().unwrap();
    let out = bin()
        .args(["--data-dir"])
        .arg(dir.path())
        .env("ROCKETGATE_STORE__FLUSH", "sometimes")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ROCKETGATE_STORE__FLUSH"), "{err}");

    let out = bin().args(["--mqtt", "not-an-address"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not-an-address"));

    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, "[store]\ndisk_soft_ratio = 0.95\n").unwrap();
    let out = bin().arg("--config").arg(&cfg).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("disk_soft_ratio"));
}

#[test]
fn standalone_starts_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = bin()
        .args(["standalone", "--data-dir"])
        .arg(dir.path())
        .args([
            "--namesrv",
            "0",
            "--native",
            "0",
            "--mqtt",
            "0",
            "--http",
            "0",
            "--ws",
            "0",
        ])
        .env("ROCKETGATE_STORE__SEGMENT_SIZE", "1MiB")
        .env("ROCKETGATE_STORE__MAX_MESSAGE_SIZE", "64KiB")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let started = Instant::now();
    let ready = lines.next().unwrap().unwrap();
    assert!(ready.contains("ready"), "{ready}");
    assert!(started.elapsed() < Duration::from_secs(60));
    assert!(dir.path().join("abort").exists(), "the store is open");
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(
        !dir.path().join("abort").exists(),
        "a clean stop removes the abort marker"
    );
    assert!(dir.path().join("checkpoint").exists());
}
