//! Issue #25, items 1-4, through the real binary: the four ways acknowledged
//! messages were lost or corrupted, each reproduced as a user met it.
//!
//! The disk tests need a small file system of their own: they mount a tmpfs of a
//! few MiB (as root; the suite runs as root on our machines), and fail loudly when
//! they cannot, rather than pass without testing anything.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The binary with small files, every door on a free port.
fn node_cmd(dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rocketgate"));
    // Past the hard ratio a store refuses appends; how full this machine's disk is
    // must not decide a test (the disk-full tests below set it on their own tmpfs).
    c.env("ROCKETGATE_STORE__DISK_HARD_RATIO", "1")
        .env("ROCKETGATE_STORE__SEGMENT_SIZE", "1MiB")
        .env("ROCKETGATE_STORE__MAX_MESSAGE_SIZE", "64KiB")
        .env("ROCKETGATE_STORE__CONSUME_QUEUE_ENTRIES_PER_FILE", "10000")
        .env("ROCKETGATE_STORE__RETENTION_CHECK_INTERVAL", "1s")
        .env("RUST_LOG", "warn")
        .args(["standalone", "--data-dir"])
        .arg(dir)
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
        ]);
    c
}

/// A running node; killed when dropped.
struct Node {
    child: Child,
    http: String,
    mqtt: String,
}

impl Node {
    fn start(dir: &Path) -> Node {
        Self::start_with(node_cmd(dir))
    }

    fn start_with(mut cmd: Command) -> Node {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let (mut http, mut mqtt) = (None, None);
        for line in BufReader::new(child.stdout.take().unwrap()).lines() {
            let line = line.unwrap();
            if let Some(addr) = line.strip_prefix("rocketgate: http listening on ") {
                http = Some(format!("http://{addr}"));
            }
            if let Some(addr) = line.strip_prefix("rocketgate: mqtt listening on ") {
                mqtt = Some(addr.trim().to_owned());
            }
            if line.contains("ready") {
                break;
            }
        }
        let http = http.expect("the node announced its HTTP door before it was ready");
        let mqtt = mqtt.expect("the node announced its MQTT door before it was ready");
        Node { child, http, mqtt }
    }

    /// SIGTERM, then waits for a clean exit.
    fn stop(mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = wait_for(&mut self.child, Duration::from_secs(30));
        assert!(status.success(), "clean stop: {status:?}");
    }

    fn curl(&self, args: &[&str]) -> (u16, String) {
        curl(&self.http, args)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a node that is expected to refuse to start: (exit status, stderr). One
/// that starts instead is killed after a while, and the caller's asserts fail.
fn run_to_exit(mut cmd: Command) -> (ExitStatus, String) {
    let err = tempfile::NamedTempFile::new().unwrap();
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(err.reopen().unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        status,
        std::fs::read_to_string(err.path()).unwrap_or_default(),
    )
}

fn wait_for(child: &mut Child, limit: Duration) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < deadline, "the process did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `curl` against `base`: (status, body).
fn curl(base: &str, args: &[&str]) -> (u16, String) {
    let (path, rest) = args.split_first().expect("a path");
    let out = Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}"])
        .args(rest)
        .arg(format!("{base}{path}"))
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// Publishes `body` to queue 0 of `topic`: (status, response).
fn publish(node: &Node, topic: &str, body: &str) -> (u16, String) {
    node.curl(&[
        &format!("/v1/topics/{topic}/messages?queue=0"),
        "-X",
        "POST",
        "--data-binary",
        body,
    ])
}

/// A tmpfs of `mib` MiB, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(mib: u32) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "these tests mount a small tmpfs and need root (CAP_SYS_ADMIN) for it"
        );
        Tmpfs { dir }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// Writes zeros into `name` until the file system is full.
    fn fill(&self, name: &str) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.dir.path().join(name)).unwrap();
        let chunk = vec![0u8; 64 << 10];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.flush();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

#[test]
fn a_second_node_on_the_same_data_dir_refuses_to_start_and_a_killed_one_does_not_block() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = Node::start(dir.path());
    let (code, _) = publish(&first, "locked", "from the first node");
    assert_eq!(code, 201);

    let (status, err) = run_to_exit(node_cmd(dir.path()));
    assert_eq!(status.code(), Some(3), "{status:?}: {err}");
    assert!(
        err.contains(&format!("in use by process {}", first.child.id())),
        "{err}"
    );
    assert!(err.contains("its own --data-dir"), "{err}");

    // kill -9 leaves the lock file behind; the kernel released the lock itself.
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let again = Node::start(dir.path());
    let (code, body) = again.curl(&["/v1/topics/locked/queues/0/messages?offset=0&max=10"]);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("from the first node"), "{body}");
    again.stop();
}

#[test]
fn a_flipped_bit_in_a_stored_body_is_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    let mut ids = Vec::new();
    for i in 0..3 {
        let (code, body) = publish(&node, "flip", &format!("message-{i}-{}", "x".repeat(64)));
        assert_eq!(code, 201, "{body}");
        ids.push(json(&body)["msg_id"].as_str().unwrap().to_owned());
    }
    node.stop();

    // One bit of message 1's body, after a clean stop: recovery trusts the log
    // below the checkpoint and does not look at it again.
    let seg = dir.path().join("commitlog").join(format!("{:020}", 0));
    let mut bytes = std::fs::read(&seg).unwrap();
    let at = bytes
        .windows(10)
        .position(|w| w == b"message-1-")
        .expect("the body is in the first segment");
    bytes[at + 20] ^= 0x01;
    std::fs::write(&seg, &bytes).unwrap();

    let node = Node::start(dir.path());
    let (code, replay) = node.curl(&["/v1/topics/flip/queues/0/messages?offset=0&max=10"]);
    assert_eq!(code, 200, "{replay}");
    assert!(replay.contains("message-0-"), "{replay}");
    assert!(replay.contains("message-2-"), "{replay}");
    assert!(
        !replay.contains("message-1-"),
        "the damaged record was served: {replay}"
    );

    let (code, byid) = node.curl(&[&format!("/v1/messages/{}", ids[1])]);
    assert_ne!(code, 200, "{byid}");
    assert!(!byid.contains("message-1-"), "{byid}");
    let (code, intact) = node.curl(&[&format!("/v1/messages/{}", ids[2])]);
    assert_eq!(code, 200, "{intact}");

    let (code, got) = node.curl(&["/v1/groups/g/topics/flip/messages?max=10&wait_ms=500"]);
    assert_eq!(code, 200, "{got}");
    assert!(
        !got.contains("message-1-"),
        "the damaged record was delivered: {got}"
    );

    let (_, health) = node.curl(&["/health"]);
    let corrupt = json(&health)["store"]["corrupt_records"].as_u64().unwrap();
    assert!(corrupt >= 1, "{health}");
    node.stop();
}

/// Publishes `body` to `topic` until the node refuses; the refusal must be 503
/// `disk_full`. Returns how many publishes were acknowledged before it.
fn fill_until_disk_full(node: &Node, topic: &str, body: &str) -> u64 {
    let mut acked = 0u64;
    let refused = loop {
        let (code, resp) = publish(node, topic, body);
        if code != 201 {
            break (code, resp);
        }
        acked += 1;
        assert!(acked < 4000, "8 MiB cannot hold {acked} x 4 KB");
    };
    assert_eq!(refused.0, 503, "{}", refused.1);
    assert_eq!(
        json(&refused.1)["error"]["code"],
        "disk_full",
        "{}",
        refused.1
    );
    acked
}

#[test]
fn a_full_disk_refuses_writes_keeps_unread_messages_and_takes_writes_when_space_returns() {
    let fs = Tmpfs::mount(8);
    // Space another program holds, freed later.
    std::fs::write(fs.path().join("other-program"), vec![1u8; 2 << 20]).unwrap();
    let mut cmd = node_cmd(&fs.path().join("data"));
    cmd.env("ROCKETGATE_STORE__DISK_HARD_RATIO", "0.9");
    let node = Node::start_with(cmd);
    let body = "m".repeat(4000);
    let acked = fill_until_disk_full(&node, "pressure", &body);
    // The MQTT door says the same to an MQTT 5 device: PUBACK 0x97 quota exceeded.
    let (host, port) = node.mqtt.rsplit_once(':').unwrap();
    let out = Command::new("mosquitto_pub")
        .args(["-h", host, "-p", port, "-V", "mqttv5", "-q", "1"])
        .args(["-t", "pressure/mqtt", "-m", &body])
        .output()
        .expect("mosquitto_pub (scripts/install-test-deps installs it)");
    let said =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("Quota exceeded"),
        "mosquitto_pub said: {said}"
    );

    // Nobody read them: every acknowledged message is still there.
    let (_, replay) = node.curl(&["/v1/topics/pressure/queues/0/messages?offset=0&max=1"]);
    let r = json(&replay);
    assert_eq!(r["min_offset"], 0, "{replay}");
    assert_eq!(r["max_offset"], acked, "{replay}");
    assert_eq!(r["messages"][0]["queue_offset"], 0, "{replay}");

    // Space comes back: writes are taken again (the disk is checked every second).
    std::fs::remove_file(fs.path().join("other-program")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (code, resp) = publish(&node, "pressure", "after the space came back");
        if code == 201 {
            break;
        }
        assert_eq!(code, 503, "{resp}");
        assert!(Instant::now() < deadline, "writes still refused: {resp}");
        std::thread::sleep(Duration::from_millis(200));
    }
    node.stop();
}

#[test]
fn a_file_system_out_of_space_below_the_hard_ratio_is_disk_full_not_internal() {
    let fs = Tmpfs::mount(8);
    // Watermarks the disk never reaches first: the next segment (1 MiB) does not fit
    // long before 99 % of 8 MiB is used, so the file system's ENOSPC is what stops writes.
    let mut cmd = node_cmd(&fs.path().join("data"));
    cmd.env("ROCKETGATE_STORE__DISK_SOFT_RATIO", "0.98")
        .env("ROCKETGATE_STORE__DISK_HARD_RATIO", "0.99");
    let node = Node::start_with(cmd);
    let body = "e".repeat(4000);
    let acked = fill_until_disk_full(&node, "enospc", &body);
    // What was acknowledged is still served.
    let (_, replay) = node.curl(&["/v1/topics/enospc/queues/0/messages?offset=0&max=1"]);
    assert_eq!(json(&replay)["max_offset"], acked, "{replay}");
    node.stop();
}

#[test]
fn a_restart_on_a_full_disk_is_an_error_and_an_exit_code_not_a_signal() {
    let fs = Tmpfs::mount(16);
    let data = fs.path().join("data");
    let node = Node::start_with({
        let mut c = node_cmd(&data);
        // RocketMQ's queue file size (5.7 MiB), as the issue met it.
        c.env("ROCKETGATE_STORE__CONSUME_QUEUE_ENTRIES_PER_FILE", "300000");
        c
    });
    for i in 0..10 {
        assert_eq!(publish(&node, "full", &format!("m{i}")).0, 201);
    }
    node.stop();
    // A queue file as an earlier version left it: sparse past what was written.
    let q = data.join("consumequeue/full/0").join(format!("{:020}", 0));
    punch_hole_after(&q, 4096);
    fs.fill("filler");

    let mut c = node_cmd(&data);
    c.env("ROCKETGATE_STORE__CONSUME_QUEUE_ENTRIES_PER_FILE", "300000");
    let (status, err) = run_to_exit(c);
    assert_eq!(status.code(), Some(4), "{status:?}: {err}");
    assert!(err.contains("No space left on device"), "{err}");
    assert!(err.contains("full or read-only"), "{err}");
}

#[test]
fn a_start_on_a_read_only_disk_is_an_error_and_an_exit_code() {
    let fs = Tmpfs::mount(16);
    let data = fs.path().join("data");
    let node = Node::start(&data);
    assert_eq!(publish(&node, "ro", "m").0, 201);
    node.stop();
    let ok = Command::new("mount")
        .args(["-o", "remount,ro"])
        .arg(fs.path())
        .status()
        .unwrap();
    assert!(ok.success());
    let (status, err) = run_to_exit(node_cmd(&data));
    assert_eq!(status.code(), Some(4), "{status:?}: {err}");
    assert!(err.contains("Read-only file system"), "{err}");
}

/// Deallocates `path` from `keep` to its end, keeping its size.
fn punch_hole_after(path: &Path, keep: u64) {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let len = f.metadata().unwrap().len();
    // SAFETY: a plain syscall on a descriptor we own.
    let rc = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            keep as libc::off_t,
            (len - keep) as libc::off_t,
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
}

/// `rocketgate verify` / `rocketgate repair` on the data directory (same store
/// settings as the node's: the environment of `node_cmd`): (exit code, stdout,
/// stderr).
fn check_cmd(dir: &Path, what: &str) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rocketgate"))
        .env("ROCKETGATE_STORE__SEGMENT_SIZE", "1MiB")
        .env("ROCKETGATE_STORE__MAX_MESSAGE_SIZE", "64KiB")
        .env("ROCKETGATE_STORE__CONSUME_QUEUE_ENTRIES_PER_FILE", "10000")
        .env("RUST_LOG", "warn")
        .args([what, "--json", "--data-dir"])
        .arg(dir)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Offline `verify` and `repair` (issue #25, item 2) on a data directory the
/// binary wrote, damaged three ways by the test: one bit of a stored body, junk
/// past the last record (a bad tail), and a consume-queue entry pointing at the
/// wrong record. `verify` finds all three (exit 5, JSON report) and refuses a
/// directory a running node holds (exit 3); `repair` quarantines the damaged
/// record, truncates the tail and rebuilds the queues; `verify` is clean after,
/// and the node serves every intact message at its offset and takes new ones.
#[test]
fn verify_finds_damage_and_repair_quarantines_truncates_and_rebuilds() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    for i in 0..5 {
        let (code, body) = publish(&node, "vr", &format!("message-{i}-{}", "x".repeat(64)));
        assert_eq!(code, 201, "{body}");
    }
    let (code, _, err) = check_cmd(dir.path(), "verify");
    assert_eq!(code, 3, "a running node's directory is refused: {err}");
    assert!(err.contains("in use by process"), "{err}");
    node.stop();

    let (code, out, err) = check_cmd(dir.path(), "verify");
    assert_eq!(code, 0, "a clean directory verifies: {out}{err}");
    let clean = json(&out);
    assert!(clean["records"].as_u64().unwrap() >= 5, "{out}");
    let log_end = clean["log_end"].as_u64().unwrap() as usize;

    // The damage.
    let seg = dir.path().join("commitlog").join(format!("{:020}", 0));
    let mut bytes = std::fs::read(&seg).unwrap();
    let at = bytes.windows(10).position(|w| w == b"message-1-").unwrap();
    bytes[at + 20] ^= 0x01;
    bytes[log_end..log_end + 9].copy_from_slice(b"junk tail");
    std::fs::write(&seg, &bytes).unwrap();
    let cq = dir
        .path()
        .join("consumequeue/vr/0")
        .join(format!("{:020}", 0));
    let mut entries = std::fs::read(&cq).unwrap();
    let entry2: [u8; 8] = entries[2 * 20..2 * 20 + 8].try_into().unwrap();
    entries[3 * 20..3 * 20 + 8].copy_from_slice(&entry2); // entry 3 -> record 2
    std::fs::write(&cq, &entries).unwrap();

    let (code, out, err) = check_cmd(dir.path(), "verify");
    assert_eq!(code, 5, "problems found: {out}{err}");
    let found = json(&out);
    assert_eq!(found["damaged_count"], 1, "{out}");
    assert_eq!(found["unreadable"].as_array().unwrap().len(), 1, "{out}");
    assert_eq!(found["unreadable"][0]["tail"], true, "{out}");
    assert!(found["queue_problem_count"].as_u64().unwrap() >= 1, "{out}");

    let (code, out, err) = check_cmd(dir.path(), "repair");
    assert_eq!(code, 0, "repaired: {out}{err}");
    let repaired = json(&out);
    assert!(
        repaired["found"]["actions"].as_array().unwrap().len() >= 3,
        "{out}"
    );
    assert!(
        dir.path()
            .join("quarantine")
            .join(format!("{at:020}"))
            .with_extension("record")
            .exists()
            || std::fs::read_dir(dir.path().join("quarantine"))
                .unwrap()
                .flatten()
                .any(|f| f.file_name().to_string_lossy().ends_with(".record")),
        "the damaged record is in quarantine/"
    );
    let (code, out, err) = check_cmd(dir.path(), "verify");
    assert_eq!(code, 0, "clean after repair: {out}{err}");
    assert_eq!(json(&out)["quarantined_count"], 1, "{out}");

    let node = Node::start(dir.path());
    let (code, replay) = node.curl(&["/v1/topics/vr/queues/0/messages?offset=0&max=10"]);
    assert_eq!(code, 200, "{replay}");
    for i in [0, 2, 3, 4] {
        assert!(replay.contains(&format!("message-{i}-")), "{i}: {replay}");
    }
    assert!(!replay.contains("message-1-"), "{replay}");
    let (code, body) = publish(&node, "vr", "after-repair");
    assert_eq!(code, 201, "{body}");
    assert_eq!(json(&body)["queue_offset"], 5, "{body}");
    node.stop();
}

/// `rocketgate truncate` (the cut an old master or a slave past its master needs):
/// on a stopped node's directory, a cut at a record boundary is durable, the node
/// restarts with the log and queues ending there, the next message takes the next
/// queue offset, and a consumer group that had read past the cut receives the new
/// messages instead of skipping them. A cut inside a record is refused.
#[test]
fn truncate_cuts_the_log_at_a_record_and_consumers_resume_at_the_cut() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    let mut phys = Vec::new();
    for i in 0..10 {
        let (code, body) = publish(&node, "tr", &format!("message-{i}"));
        assert_eq!(code, 201, "{body}");
        let id = json(&body)["msg_id"].as_str().unwrap().to_owned();
        phys.push(u64::from_str_radix(&id[id.len() - 16..], 16).unwrap());
    }
    // A group reads and acks all ten.
    let (code, got) = node.curl(&["/v1/groups/g/topics/tr/messages?max=32&wait_ms=2000"]);
    assert_eq!(code, 200, "{got}");
    let handles: Vec<serde_json::Value> = json(&got)["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["receipt_handle"].clone())
        .collect();
    assert_eq!(handles.len(), 10, "{got}");
    let body = serde_json::json!({ "receipt_handles": handles }).to_string();
    let (code, acked) = node.curl(&[
        "/v1/groups/g/acks",
        "-H",
        "content-type: application/json",
        "--data-binary",
        &body,
    ]);
    assert!(code == 200 || code == 204, "{code} {acked}");
    node.stop();

    let truncate = |to: u64| {
        Command::new(env!("CARGO_BIN_EXE_rocketgate"))
            .env("ROCKETGATE_STORE__SEGMENT_SIZE", "1MiB")
            .env("ROCKETGATE_STORE__MAX_MESSAGE_SIZE", "64KiB")
            .env("ROCKETGATE_STORE__CONSUME_QUEUE_ENTRIES_PER_FILE", "10000")
            .env("RUST_LOG", "warn")
            .args(["truncate", "--json", "--to", &to.to_string(), "--data-dir"])
            .arg(dir.path())
            .output()
            .unwrap()
    };
    let out = truncate(phys[5] + 1);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not the start of a record"), "{err}");

    let out = truncate(phys[5]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = json(&text);
    assert_eq!(report["new_end"], phys[5], "{text}");
    assert!(report["removed_bytes"].as_u64().unwrap() > 0, "{text}");
    assert!(dir.path().join("quarantine").is_dir());

    let node = Node::start(dir.path());
    let (code, replay) = node.curl(&["/v1/topics/tr/queues/0/messages?offset=0&max=20"]);
    assert_eq!(code, 200, "{replay}");
    for i in 0..5 {
        assert!(replay.contains(&format!("message-{i}\"")), "{i}: {replay}");
    }
    for i in 5..10 {
        assert!(!replay.contains(&format!("message-{i}\"")), "{i}: {replay}");
    }
    for i in 0..3 {
        let (code, body) = publish(&node, "tr", &format!("new-{i}"));
        assert_eq!(code, 201, "{body}");
        assert_eq!(json(&body)["queue_offset"], 5 + i, "{body}");
    }
    let (code, got) = node.curl(&["/v1/groups/g/topics/tr/messages?max=32&wait_ms=2000"]);
    assert_eq!(code, 200, "{got}");
    let bodies: Vec<String> = json(&got)["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(bodies, ["new-0", "new-1", "new-2"], "{got}");
    node.stop();
}
