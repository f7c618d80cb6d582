//! # interop-tests
//!
//! The harness that starts the built `rocketgate` binary on free ports with a fresh data
//! directory and drives it from outside, as a user would. Every cross-door test uses
//! [`Node`]: [`Node::start`] runs `rocketgate standalone` and waits for its readiness
//! line, [`Node::addr`] gives the address a door announced, [`Node::stop`] sends SIGTERM
//! (a clean stop), [`Node::kill9`] sends SIGKILL (a crash), and [`Node::restart`] starts
//! the binary again on the same data directory and the same ports.
//!
//! The tests: `tests/matrix.rs` (every publisher door × consumer door, prints the
//! table; the cells are [`matrix`]), `tests/matrix_proxy.rs` (the same cells published
//! through proxy 1 and consumed through proxy 2 of a [`cluster::Cluster`]: two broker
//! groups and two `rocketgate proxy` nodes), `tests/crash_story_proxy.rs` (the story
//! through a proxy's doors, with `kill -9` of the consumer's proxy and of a broker
//! group's master), `tests/cluster.rs` (proxy mode), `tests/crash_story.rs` (1,000 messages, ack 500, `kill -9`, restart, the rest,
//! reset to a timestamp — per consuming door, scenario helpers in [`story`]),
//! `tests/delay.rs` (a delayed message from every door to every door, never early),
//! `tests/dlq.rs` (three failures → `%DLQ%<group>`, listed and re-sent over HTTP),
//! `tests/dashboard.rs` (the web dashboard in headless Chromium via playwright-core),
//! `tests/failover.rs` (kill -9 of a controlled master) and `tests/partition.rs` (the
//! write lease with the controllers frozen, a master partitioned away in a network
//! namespace — [`Node::start_under`] runs it under `ip netns exec` — and the controller
//! leader killed with the master).
//!
//! The binary is found at `$ROCKETGATE_BIN`, else next to the test executable's target
//! directory (`target/<profile>/rocketgate`); `scripts/test` builds it first
//! (`cargo build --workspace --bins`). A missing binary is a failing test with that hint,
//! never a skip.

// Signals to our own children: each unsafe block says why.
#![deny(clippy::undocumented_unsafe_blocks)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

pub mod cluster;
pub mod doors;
pub mod matrix;
pub mod pki;
pub mod story;

/// The lines a child process writes, read on a thread of their own (so the child
/// never blocks on a full pipe) and handed over as they come.
pub(crate) fn lines_of(out: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The doors a standalone node announces (`rocketgate: <door> listening on <addr>`).
pub const DOORS: [&str; 6] = ["namesrv", "native", "mqtt", "http", "ws", "ha"];

/// How long a node may take to print its ready line (a cold, busy CI machine).
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// Where the built `rocketgate` binary is.
pub fn binary() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("ROCKETGATE_BIN") {
        return Ok(PathBuf::from(p));
    }
    // Test executables live in target/<profile>/deps/; the binary in target/<profile>/.
    let exe = std::env::current_exe().context("locating the test executable")?;
    let mut candidates = Vec::new();
    if let Some(profile_dir) = exe.parent().and_then(Path::parent) {
        candidates.push(profile_dir.join("rocketgate"));
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    candidates.push(workspace.join("target/debug/rocketgate"));
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .with_context(|| {
            format!(
                "the rocketgate binary is not built (looked at {candidates:?}); run \
                 `cargo build --bins` or scripts/test, or set ROCKETGATE_BIN"
            )
        })
}

/// Settings every test node runs with: small segments, sync flush (an acknowledged
/// message survives `kill -9`).
fn base_env() -> Vec<(&'static str, String)> {
    vec![
        ("ROCKETGATE_STORE__SEGMENT_SIZE", "8MiB".into()),
        ("ROCKETGATE_STORE__FLUSH", "sync".into()),
        // Past the hard ratio a store refuses appends: how full this machine's disk
        // happens to be must not decide a test (tests/reliability.rs fills a tmpfs).
        ("ROCKETGATE_STORE__DISK_HARD_RATIO", "1".into()),
        ("RUST_LOG", "info".into()),
    ]
}

/// A running `rocketgate standalone` (or another node command: [`Node::launch`]), killed
/// when dropped.
pub struct Node {
    child: Option<Child>,
    data_dir: PathBuf,
    /// Keeps the data directory alive (and removes it) when the node owns it.
    _tmp: Option<tempfile::TempDir>,
    addrs: HashMap<String, SocketAddr>,
    extra_env: Vec<(String, String)>,
    /// A command the binary runs under (`ip netns exec NS`), empty for none.
    wrapper: Vec<String>,
    /// The address every door binds (a fresh port each, unless restarted).
    host: IpAddr,
    log: PathBuf,
    /// Lines printed on stdout after the ready line, for debugging.
    stdout_rest: Option<mpsc::Receiver<String>>,
    /// The subcommand and its fixed arguments (`["standalone"]`, `["proxy", "--namesrv",
    /// …]`).
    command: Vec<String>,
    /// The doors given a listen flag (`--<door> ADDR`) at every start.
    door_flags: Vec<String>,
}

impl Node {
    /// Starts a node on free ports with a fresh data directory.
    pub fn start() -> anyhow::Result<Node> {
        Self::start_with_env(&[])
    }

    /// Like [`Node::start`] with extra `ROCKETGATE_*` settings (`("KEY", "value")`).
    pub fn start_with_env(env: &[(&str, &str)]) -> anyhow::Result<Node> {
        Self::start_under(&[], IpAddr::V4(Ipv4Addr::LOCALHOST), env)
    }

    /// Like [`Node::start_with_env`], with every door bound on `host` and the binary
    /// run under `wrapper` (a command that ends by exec'ing its arguments, such as
    /// `["ip", "netns", "exec", "ns1"]`, so the child's pid stays the node's and
    /// [`Node::kill9`] reaches it). [`Node::restart`] keeps both.
    pub fn start_under(
        wrapper: &[&str],
        host: IpAddr,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Node> {
        Self::launch_under(wrapper, host, &["standalone"], &DOORS, env)
    }

    /// Another node command on free loopback ports with a fresh data directory:
    /// `command` is the subcommand and its fixed arguments (`["broker", "--namesrv",
    /// addr, "--name", "broker-b"]`, `["proxy", "--namesrv", addr]`), `doors` the
    /// listeners it takes a `--<door> ADDR` flag for. Ready when it prints its
    /// `rocketgate … ready` line.
    pub fn launch(command: &[&str], doors: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Node> {
        Self::launch_under(&[], IpAddr::V4(Ipv4Addr::LOCALHOST), command, doors, env)
    }

    fn launch_under(
        wrapper: &[&str],
        host: IpAddr,
        command: &[&str],
        doors: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Node> {
        let tmp = tempfile::Builder::new()
            .prefix("rg-interop-")
            .tempdir()
            .context("creating the data directory")?;
        let data_dir = tmp.path().join("data");
        let mut node = Node {
            child: None,
            log: tmp.path().join("node.log"),
            data_dir,
            _tmp: Some(tmp),
            addrs: HashMap::new(),
            extra_env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            wrapper: wrapper.iter().map(|s| s.to_string()).collect(),
            host,
            stdout_rest: None,
            command: command.iter().map(|s| s.to_string()).collect(),
            door_flags: doors.iter().map(|s| s.to_string()).collect(),
        };
        let any = SocketAddr::new(host, 0).to_string();
        let ports: Vec<(String, String)> = node
            .door_flags
            .iter()
            .map(|d| (d.clone(), any.clone()))
            .collect();
        node.spawn(&ports)?;
        Ok(node)
    }

    fn spawn(&mut self, listen: &[(String, String)]) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .context("opening the node log")?;
        let mut cmd = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(binary()?);
                c
            }
            None => Command::new(binary()?),
        };
        cmd.args(&self.command)
            .arg("--data-dir")
            .arg(&self.data_dir);
        // Not a setting: the node refuses unknown `ROCKETGATE_*` variables.
        cmd.env_remove("ROCKETGATE_BIN");
        for (door, addr) in listen {
            cmd.arg(format!("--{door}")).arg(addr);
        }
        for (k, v) in base_env() {
            cmd.env(k, v);
        }
        for (k, v) in &self.extra_env {
            cmd.env(k, v);
        }
        cmd.stdout(Stdio::piped()).stderr(log);
        let mut child = cmd.spawn().context("starting rocketgate")?;
        let stdout = child.stdout.take().context("no stdout")?;
        self.child = Some(child);

        // A thread reads stdout so the node never blocks on a full pipe.
        let rx = lines_of(stdout);
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut addrs = HashMap::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match rx.recv_timeout(left) {
                Ok(line) => line,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    bail!(
                        "no ready line within {READY_TIMEOUT:?}\n{}",
                        self.log_tail()
                    )
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.child.as_mut().and_then(|c| c.wait().ok());
                    bail!(
                        "rocketgate exited before it was ready ({status:?})\n{}",
                        self.log_tail()
                    )
                }
            };
            if let Some(rest) = line.strip_prefix("rocketgate: ") {
                if let Some((door, addr)) = rest.split_once(" listening on ") {
                    let addr: SocketAddr = addr
                        .trim()
                        .parse()
                        .with_context(|| format!("bad address in {line:?}"))?;
                    addrs.insert(door.to_string(), addr);
                }
            } else if line.starts_with("rocketgate ") && line.contains(" ready") {
                break;
            }
        }
        self.addrs = addrs;
        self.stdout_rest = Some(rx);
        Ok(())
    }

    /// The address a door announced; fails the test if the door did not start.
    pub fn addr(&self, door: &str) -> SocketAddr {
        match self.addrs.get(door) {
            Some(a) => *a,
            None => panic!(
                "the node announced no {door} door (it announced {:?})",
                self.addrs.keys().collect::<Vec<_>>()
            ),
        }
    }

    /// Records an address this node did not announce, for the door helpers: a proxy's
    /// `namesrv` is the cluster's NameServer (native clients of [`doors`] look it up).
    pub fn set_addr(&mut self, door: &str, addr: SocketAddr) {
        self.addrs.insert(door.to_string(), addr);
    }

    /// The doors this node announced.
    pub fn doors(&self) -> Vec<String> {
        let mut d: Vec<String> = self.addrs.keys().cloned().collect();
        d.sort();
        d
    }

    /// The running process's id (to stop it with SIGSTOP, say).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    fn signal(&mut self, sig: i32) -> anyhow::Result<std::process::ExitStatus> {
        let child = self.child.as_mut().context("the node is not running")?;
        // SAFETY: signalling our own child process, whose pid we own until we wait.
        unsafe { libc::kill(child.id() as i32, sig) };
        let status = child.wait().context("waiting for the node")?;
        self.child = None;
        Ok(status)
    }

    /// A clean stop (SIGTERM); fails unless the process exits successfully.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        let status = self.signal(libc::SIGTERM)?;
        if !status.success() {
            bail!("rocketgate stopped with {status}\n{}", self.log_tail());
        }
        Ok(())
    }

    /// A crash: SIGKILL, no chance to flush or close anything.
    pub fn kill9(&mut self) -> anyhow::Result<()> {
        self.signal(libc::SIGKILL).map(|_| ())
    }

    /// Starts the binary again on the same data directory and the same ports.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        if self.child.is_some() {
            bail!("restart needs a stopped node (stop or kill9 first)");
        }
        // The same ports; a door it did not announce (a replication port it had not
        // opened yet) on a fresh one.
        let any = SocketAddr::new(self.host, 0).to_string();
        let listen: Vec<(String, String)> = self
            .door_flags
            .iter()
            .map(|d| {
                let addr = self.addrs.get(d).map_or(any.clone(), |a| a.to_string());
                (d.clone(), addr)
            })
            .collect();
        // The old ports may sit in TIME_WAIT for a moment on a busy machine.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match self.spawn(&listen) {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() < deadline && format!("{e:#}").contains("in use") => {
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The node's whole log (stderr) so far, without terminal colour codes.
    pub fn log_text(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        let mut out = String::with_capacity(s.len());
        let mut chars = s.chars();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                // CSI: ESC [ ... final byte in @..~
                for d in chars.by_ref() {
                    if ('@'..='~').contains(&d) && d != '[' {
                        break;
                    }
                }
            } else {
                out.push(c);
            }
        }
        out
    }

    /// The last lines of the node's log (stderr), for failure messages.
    pub fn log_tail(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        let lines: Vec<&str> = s.lines().collect();
        let from = lines.len().saturating_sub(40);
        format!(
            "--- node log (last lines) ---\n{}",
            lines[from..].join("\n")
        )
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("{}", self.log_tail());
        }
    }
}

/// Waits until `f` returns `Some`, or fails after `timeout` naming `what`.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Wall-clock time in unix milliseconds, as the broker stamps messages.
pub use rocketgate_base::clock::now_ms;
